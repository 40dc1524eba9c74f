"""The explorer in a real headless browser: the distribution's Chromium driven by Playwright's Python API.

No browser is downloaded: Playwright launches /usr/bin/chromium (scripts/setup/viewer.sh installs
it). The tour runs on the store of a real tiny CLI run and takes the screenshots of docs/viewer.md:
they are written there with ARBORL_SCREENSHOTS=docs/viewer (else into the test's temp dir, so the
suite leaves the tree as it found it).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clikit import ROOT, arborl, cli_env

CHROMIUM = Path("/usr/bin/chromium")

playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
if not CHROMIUM.exists():
    pytest.skip("no /usr/bin/chromium: run scripts/setup/viewer.sh as root", allow_module_level=True)


@contextlib.contextmanager
def serve(store_url: str, *runs: Path):
    """``arborl view STORE_URL --run ... --port 0`` in a subprocess; yields its base URL."""
    args = [a for r in runs for a in ("--run", str(r))]
    p = subprocess.Popen([sys.executable, "-m", "arborl.cli", "view", store_url, *args, "--port", "0"],
                         stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert m, f"arborl view printed {line!r}"
        yield m.group(0)
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def page():
    """A fresh Chromium page that records console errors and uncaught exceptions in ``page.errors``."""
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.errors = []
        pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        yield pg
        browser.close()


def open_hash(pg, base: str, frag: str, ready: str) -> float:
    """Go to ``#frag`` in the loaded app and wait for ``ready``; returns the milliseconds it took."""
    t0 = time.perf_counter()
    pg.evaluate("h => { location.hash = h; }", frag)
    pg.wait_for_selector(ready)
    return (time.perf_counter() - t0) * 1000


def test_twenty_turn_episode_renders_within_300_ms(page, view_store):
    with serve(view_store) as base:
        page.goto(base)
        page.wait_for_selector("#episodes tr.row")
        assert page.evaluate("[...document.querySelectorAll('#sources option')].map(o => o.value)") == ["rl", "rl-branch"]
        assert page.locator("#episodes tr.env-error").evaluate_all("rs => rs.map(r => r.dataset.id)") == ["err"]
        times = [open_hash(page, base, f"#/episode/long?n={k}", "main[data-view=episode] .turn") for k in range(5)]
        ms = sorted(times)[len(times) // 2]
        print(f"20-turn episode: fetch + render {ms:.0f} ms median of 5 (in-page {page.locator('main').get_attribute('data-render-ms')} ms)")
        assert ms <= 300, times
        assert page.locator(".turn").count() == 20
        assert page.locator(".tok.mask0").count() == 20  # each turn's end token has loss mask 0
        assert "grpo 0.5" in page.locator(".advantages").inner_text()
        assert page.evaluate("document.querySelector('img.media').naturalWidth") == 2
        page.click("#toggle-logprobs")
        page.wait_for_function("document.querySelector('.tok:not(.mask0)').style.background !== ''")
        open_hash(page, base, "#/episode/tree", "main[data-view=episode] .branches")
        assert page.locator(".turn").count() == 3
        # a's branch a-br is its own episode: listed after a's turn 0, its own turn shown in place on "expand"
        open_hash(page, base, "#/episode/a", "main[data-view=episode] .expand")
        assert page.locator(".turn").count() == 3
        page.click(".expand")  # the only continuation of a
        page.wait_for_selector(".continuation .turn")
        assert page.locator(".continuation .turn .action").all_inner_texts() == ["Up"]
        assert page.locator(".turn").count() == 4
        open_hash(page, base, "#/episode/nope", "#error")
        assert "no episode 'nope'" in page.inner_text("#error")
    assert [e for e in page.errors if "404" not in e] == []  # the 404 of 'nope' is the one expected error


@pytest.mark.slow
def test_tour_of_a_tiny_cli_run(page, tmp_path):
    run = tmp_path / "tiny"
    arborl("train", "examples/tiny.toml", "--set", f'run_dir="{run}"')
    shots = Path(os.environ.get("ARBORL_SCREENSHOTS") or tmp_path / "shots")
    if not shots.is_absolute():
        shots = ROOT / shots
    shots.mkdir(exist_ok=True)
    page.errors.clear()
    with serve(f"sqlite:///{run}/trajectories.db", run) as base:
        page.goto(base)
        page.wait_for_selector("#episodes tr.row")
        page.screenshot(path=shots / "episodes.png")
        # filter to failed episodes
        page.select_option("select[name=success]", "false")
        page.click("#apply")
        page.wait_for_function("location.hash.includes('success=false') && document.querySelector('main').dataset.view")
        cells = page.locator("#episodes tr.row td:nth-child(7)").all_inner_texts()
        assert cells and set(cells) == {"false"}
        # open one, see its turns
        page.locator("#episodes tr.row").first.click()
        page.wait_for_selector("main[data-view=episode] .turn")
        assert page.locator(".turn").count() >= 1
        # its group side by side, the first divergence marked
        page.click("#to-group")
        page.wait_for_selector("#group")
        assert page.locator("#group thead th").count() >= 3  # the turn column and at least two episodes
        assert page.locator("#first-divergence").count() == 1
        page.screenshot(path=shots / "group.png")
        # the group's first episode (a trunk: its branches hang off its turns), tokens shaded by log-prob
        page.locator("#group thead th a").first.click()
        page.wait_for_selector("main[data-view=episode] .turn")
        page.click("#toggle-logprobs")
        page.wait_for_selector("main[data-view=episode] .tok[style]")
        if page.locator(".expand").count():  # show one branch's own turns in place
            page.locator(".expand").first.click()
            page.wait_for_selector(".continuation .turn")
        page.screenshot(path=shots / "episode.png")
        # the run's learning curve
        page.click("#nav-runs")
        page.wait_for_selector("#curves svg polyline", state="attached")
        page.screenshot(path=shots / "runs.png")
        page.click("#nav-profile")
        page.wait_for_selector("#profile tr td")
        page.screenshot(path=shots / "profile.png")
    assert page.errors == []


def test_runs_side_by_side_and_the_profile_chart(page, view_store, run_dir, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    with (other / "metrics.jsonl").open("a") as f:
        f.write('\n{"stage": "rl", "step": 3, "env_steps": 70, "success": 1.0, "reward": 2.0}\n')
    page.errors.clear()
    with serve(view_store, run_dir, other) as base:
        page.goto(base + "#/runs")
        page.wait_for_selector("#curves .chart")
        assert page.locator("#curves .chart").evaluate_all("cs => cs.map(c => c.dataset.title)") == ["success", "reward"]
        # one line per run: the run's two evaluations (env steps 10, 50), the copy's three (and 70)
        counts = page.locator("#curves .chart[data-title=success] polyline").evaluate_all(
            "ls => ls.map(l => l.getAttribute('points').split(' ').length)")
        assert counts == [2, 3]
        assert page.locator("#curves .legend").first.locator("span").all_inner_texts() == [run_dir.name, "other"]
        page.select_option("#metric", ["loss/policy"])
        page.wait_for_selector("#curves .chart[data-title='loss/policy']")
        open_hash(page, base, "#/profile", "#profile tr td")
        # grouped by task type and iteration: frozenlake at iterations 1 and 2
        rows = page.locator("#profile tr").all_inner_texts()[1:]
        assert [r.split("\t")[:3] for r in rows] == [["frozenlake", "1", "6"], ["frozenlake", "2", "1"]]
        assert page.locator(".chart[data-title='success rate by iteration'] polyline").count() == 1
    assert page.errors == []
