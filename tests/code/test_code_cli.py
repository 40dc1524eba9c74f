"""The code-agent recipe through the real CLI on a tiny budget: synth -> sft -> rl -> eval."""

from __future__ import annotations

import json

from tests.e2e.clikit import TINY, arborl, cli_env, sets

METRICS = ("pass_rate", "tool_calls", "fixed_failing", "sandbox_timeouts", "submitted", "submitted_untested")


def test_code_agent_recipe_end_to_end(tmp_path):
    run = tmp_path / "run"
    arborl("train", "examples/code_agent.toml", *sets(run, ["rollout.env_workers=4"]), env=cli_env())
    budget = dict(kv.split("=") for kv in TINY)
    n_eval, n_demos = int(budget["eval.episodes"]), int(budget["synth.episodes"])
    summary = json.loads((run / "summary.json").read_text())
    for stage in ("sft", "rl"):
        figures = summary[stage]
        assert 0.0 <= figures["success"] <= figures["submitted"] <= 1.0
        assert all(figures[f"{m}_n"] == n_eval for m in METRICS)  # every evaluated episode reports them
        assert 0.0 <= figures["pass_rate"] <= 1.0 and figures["tool_calls"] >= 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("tools/time_share" in r or "train/tools/time_share" in r for r in rows)

    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        demos = list(store.iter_episodes(source="synth"))
        evals = list(store.iter_episodes(source="eval-rl"))
    assert len(demos) == n_demos
    untested = [e for e in demos if e.path()[-1].info["metrics"]["submitted_untested"] == 1.0]
    # the example's imperfect teacher: a bug report submitted untested fails; every other demonstration succeeds
    assert untested and all(len(e.path()) == 1 and not e.success for e in untested)
    slipped = {e.episode_id for e in untested}
    assert all(e.success for e in demos if e.episode_id not in slipped)
    assert len(evals) == n_eval and all(e.seed >= 1_000_000_000 for e in evals)
    fixes = [e for e in demos if e.path()[-1].info["metrics"]["fixed_failing"] == 1.0]
    assert fixes and all(len(e.path()) == 3 and e.path()[0].tool_call.name == "python" for e in fixes)
