"""``arborl view`` and ``arborl store show`` through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

from clikit import ROOT, arborl, cli_env


def test_store_show_prints_the_tree_of_turns(view_store):
    out = arborl("store", "show", view_store, "tree").stdout
    assert "episode tree" in out and "branch 1 of 2" in out and "branch 2 of 2" in out
    assert out.index("off path") < out.index("on path")  # branches in creation order
    long = arborl("store", "show", view_store, "long").stdout
    assert "turn 19" in long and "(1 with loss mask 0)" in long and "grpo 0.5" in long
    err = arborl("store", "show", view_store, "err").stdout
    assert "ToolError: the search backend timed out" in err and "search({'q': 'capital of France'})" in err
    br = arborl("store", "show", view_store, "a-br").stdout
    assert "branch of a from turn 1, action Up" in br


def test_store_show_unknown_episode_is_one_line(view_store):
    p = arborl("store", "show", view_store, "nope", check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "no episode 'nope'" in p.stderr


def test_view_refuses_a_missing_store_and_masks_passwords(tmp_path):
    p = arborl("view", f"sqlite:///{tmp_path}/none.db", "--port", "0", check=False)
    assert p.returncode == 2 and "none.db" in p.stderr and p.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing created
    p = arborl("view", "postgresql://viewer:hunter2@127.0.0.1:1/db", "--port", "0", check=False)
    assert p.returncode == 2 and "hunter2" not in p.stderr + p.stdout and "***" in p.stderr


def test_view_serves_on_loopback_and_prints_the_address(view_store, run_dir):
    p = subprocess.Popen([sys.executable, "-m", "arborl.cli", "view", view_store, "--run", str(run_dir), "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
    try:
        line = p.stdout.readline()
        m = re.match(r"arborl view: http://127\.0\.0\.1:(\d+)/ ", line)
        assert m, line + p.stderr.read() if p.poll() is not None else line
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/api/episodes?limit=2", timeout=30) as r:
            assert [e["episode_id"] for e in json.load(r)["episodes"]] == ["long", "err"]
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_view_on_a_port_in_use_is_one_line_with_the_fix(view_store):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = arborl("view", view_store, "--port", str(port), check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert f"arborl view: cannot listen on 127.0.0.1:{port}" in p.stderr and "--port (0 picks a free one)" in p.stderr
