"""The README's Python API example runs as written (in a scratch directory holding the examples)."""

import json
import re
import subprocess
import sys

from clikit import ROOT, cli_env


def readme_api_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_api_example_runs(tmp_path):
    code = readme_api_example()
    assert "from arborl import load_config, train" in code and len(code.strip().splitlines()) <= 5
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "example.py").write_text(code)
    p = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True, cwd=tmp_path,
                       env=cli_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "runs" / "notebook" / "summary.json").read_text())
    last = p.stdout.strip().splitlines()[-1]
    assert last == f"{summary['rl']['success']} {summary['rl_gain']}"
    assert "after RL" in p.stdout  # the table, as the CLI prints it
    rows = [json.loads(x) for x in (tmp_path / "runs" / "notebook" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "rl"] == [1, 2, 3]
