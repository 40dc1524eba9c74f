"""The README's own-environment example, taken from README.md itself: it passes check_env and
trains through the real CLI by import path, on a tiny budget."""

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from arborl.env import check_env

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "synth.episodes=40", "sft.steps=4", "sft.batch_size=8", "sft.eval_every=0",
    "rl.iterations=1", "rl.tasks_per_iter=2", "rl.group_size=2", "rl.minibatch_size=8", "rl.eval_every=0",
    "rl.checkpoint_every=0", "eval.episodes=4", "eval.probe_episodes=2", "policy.tokenizer_episodes=20",
    "policy.model.hidden_size=32", "policy.model.intermediate_size=64", "policy.model.num_heads=2",
    "policy.model.num_kv_heads=2", "policy.model.num_layers=1", "threads=1",
]


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@pytest.fixture(scope="module")
def user_package(tmp_path_factory):
    """``my_pkg/envs.py`` holding exactly the README's code, on a fresh directory."""
    section = readme_section("Your own environment")
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's own-environment section should hold one python block"
    root = tmp_path_factory.mktemp("user")
    (root / "my_pkg").mkdir()
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "envs.py").write_text(blocks[0])
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].strip().splitlines()
    return root, commands


def user_env(root: Path) -> dict[str, str]:
    return {"ARBORL_PROGRESS": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{root}"}


def test_readme_env_passes_check_env(user_package, monkeypatch):
    root, commands = user_package
    # The README's check command, as a shell would run it.
    check = shlex.split(commands[0])
    assert check[0] == "python" and "check_env(Maze())" in check[-1]
    p = subprocess.run([sys.executable, *check[1:]], capture_output=True, text=True, env=user_env(root), cwd=root)
    assert p.returncode == 0, p.stderr
    # And on more seeds and sizes than the README shows.
    monkeypatch.syspath_prepend(str(root))
    envs = importlib.import_module("my_pkg.envs")
    for seed in range(10):
        check_env(envs.Maze(), seed=seed)
        check_env(envs.Maze(size=5), seed=seed)


def test_readme_env_trains_through_the_cli_by_import_path(user_package, tmp_path):
    root, commands = user_package
    # The README's command as a shell splits it, then a tiny budget and a private run_dir.
    args = shlex.split(commands[1])
    assert args[:3] == ["arborl", "train", "examples/frozenlake.toml"]
    for kv in [f'run_dir="{tmp_path}"', *TINY]:
        args += ["--set", kv]
    p = subprocess.run([sys.executable, "-m", "arborl.cli", *args[1:]], capture_output=True, text=True,
                       env=user_env(root), timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["env"] == {**summary["config"]["env"], "cls": "my_pkg.envs:Maze", "kwargs": {"size": 5}}
    assert summary["env_steps"] > 40  # the demonstrations' turns and the RL turns
    for stage in ("sft", "rl"):
        assert 0.0 <= summary[stage]["success"] <= 1.0
    # The trained policy's tokenizer reads the maze's observations word for word in plain transformers.
    tok = AutoTokenizer.from_pretrained(tmp_path / "policy" / "rl")
    assert tok.tokenize("you 0 1 goal 2 3") == ["you", "0", "1", "goal", "2", "3"]
