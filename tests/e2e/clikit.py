"""Running the real ``arborl`` CLI on a tiny budget (shared by the e2e tests)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "synth.episodes=60", "sft.steps=6", "sft.batch_size=8", "sft.eval_every=3",
    "rl.iterations=2", "rl.tasks_per_iter=2", "rl.group_size=3", "rl.minibatch_size=4", "rl.eval_every=1",
    "rl.checkpoint_every=1", "eval.episodes=8", "eval.probe_episodes=4", "policy.tokenizer_episodes=40",
    "policy.model.hidden_size=32", "policy.model.intermediate_size=64", "policy.model.num_heads=2",
    "policy.model.num_kv_heads=2", "threads=1",
]
"""Overrides of examples/frozenlake.toml that make a whole run take seconds."""


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this tree on the path, no progress bars unless asked."""
    env = {"ARBORL_PROGRESS": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": os.environ.get("HOME", "/tmp")}
    env.update(extra)
    return env


def start(*args: str) -> subprocess.Popen:
    """Start ``arborl ARGS`` in the background for a test that stops it with :func:`ctrl_c`."""
    return subprocess.Popen([sys.executable, "-m", "arborl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(PYTHONFAULTHANDLER="1"), cwd=ROOT,
                            preexec_fn=ctrl_c_reaches_it)


def ctrl_c(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Send SIGINT to a process from :func:`start`; returns its stdout and stderr once it has exited.

    If it is still running after ``timeout`` seconds, SIGABRT makes it print every thread's stack
    (``PYTHONFAULTHANDLER``) and the test fails with them: a hang after Ctrl-C says where it hangs.
    """
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate()
        raise AssertionError(f"still running {timeout} s after Ctrl-C; its threads then:\n{err[-12000:]}") from None


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a CLI subprocess that a test stops with SIGINT: default SIGINT handling.

    A suite started in the background by a non-interactive shell inherits SIGINT ignored, and a
    Python started that way never raises ``KeyboardInterrupt``: the signal would be lost.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def arborl(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``arborl ARGS`` to completion; raise with its output when ``check`` and it failed."""
    p = subprocess.run([sys.executable, "-m", "arborl.cli", *args], capture_output=True, text=True,
                       env=env or cli_env(), timeout=600, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"arborl {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def sets(run_dir: Path, extra: list[str] = ()) -> list[str]:
    """``--set`` arguments: ``run_dir``, the tiny budget, then ``extra``."""
    out = []
    for kv in [f'run_dir="{run_dir}"', *TINY, *extra]:
        out += ["--set", kv]
    return out
