"""A run directory's state: what an earlier command left there, and what ``--resume`` / ``--overwrite`` do.

One run directory holds one run. A command that would run a stage whose outputs are already
there is refused unless it is told to continue (``--resume``) or to replace them (``--overwrite``),
as Hugging Face's ``overwrite_output_dir``: two runs appending to one ``metrics.jsonl`` cannot be
told apart afterwards. ``eval`` is the exception: it only reads checkpoints, and rerunning it
replaces its outputs.

``run_state.json`` records the stages that finished (``synth`` and ``sft``, with the statistics
later stages need); RL's progress is its newest checkpoint under ``checkpoints/rl-*``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arborl.config import ConfigError

STATE_FILE = "run_state.json"
LOCK_FILE = ".lock"
"""Held (``flock``) by the process running in the directory; it holds that process's pid."""

STAGE_OUTPUTS = {
    "synth": ("trajectories.db", "trajectories.db.blobs", "trajectories.db-wal", "trajectories.db-shm"),
    "midtrain": ("policy/midtrain",),
    "sft": ("policy/sft",),
    "merge": ("policy/merge",),
    "rl": ("checkpoints", "policy/rl", "advantages.jsonl"),
}
"""Files and folders in ``run_dir`` that each stage writes (the store file only when it is the default)."""

RUN_OUTPUTS = ("metrics.jsonl", "tb", "wandb", "mlruns", "summary.json", "learning_curve.png", "config.toml",
               "policy/init", STATE_FILE)
"""What a whole run writes besides the stages' outputs; ``--overwrite`` of ``train`` removes all of it."""


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete RL checkpoint directory, or None."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("rl-*") if (p / "trainer_state.pt").exists()) if root.exists() else []
    return done[-1] if done else None


def checkpoint_iteration(path: Path) -> int:
    """The iteration an ``rl-NNNNNN`` checkpoint was written after."""
    return int(path.name.split("-")[-1])


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` RL checkpoints; return the deleted ones."""
    root = Path(run_dir) / "checkpoints"
    old = sorted(root.glob("rl-*"))[:-keep] if root.exists() else []
    for p in old:
        shutil.rmtree(p)
    return old


@dataclass
class Plan:
    """What a command does with each requested stage, decided before any of them runs."""

    run: list[str]
    """Stages to run, in order."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Stages not run (finished by an earlier command), with the reason."""
    resume_from: Path | None = None
    """The RL checkpoint RL continues from."""
    state: dict[str, Any] = field(default_factory=dict)
    """Statistics of the finished stages (e.g. ``{"sft": {"demo_turns": ...}}``)."""


class RunDir:
    """The outputs of the run in one directory, read and written by the pipeline."""

    def __init__(self, path: str | Path, *, default_store: bool) -> None:
        self.path = Path(path)
        self.default_store = default_store

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the directory for this process while it runs; a second process is refused.

        Two processes in one run directory (a second ``train``, or ``compare --resume`` while the
        first compare still runs that seed) would both "resume" from the same checkpoints and write
        one ``metrics.jsonl`` and one ``summary.json``. The lock is an ``flock`` on ``.lock``: the
        kernel releases it when the process dies, so a killed run never leaves a stale lock.

        Raises:
            ConfigError: another process holds the directory (its pid is in the message).
        """
        existed = self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        f = open(self.path / LOCK_FILE, "a+")  # noqa: SIM115 - held open for the whole run
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ConfigError(f"run_dir {self.path} is in use by another arborl process (pid {holder}); "
                              "wait for it to finish or stop it, or choose another run_dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
            if not existed and [q.name for q in self.path.iterdir()] == [LOCK_FILE]:
                (self.path / LOCK_FILE).unlink()  # a refused command leaves no empty run directory
                self.path.rmdir()

    def finished(self) -> dict[str, Any]:
        """Stages that finished, each with its statistics."""
        f = self.path / STATE_FILE
        return json.loads(f.read_text()).get("finished", {}) if f.exists() else {}

    def mark_finished(self, stage: str, stats: dict[str, Any] | None = None) -> None:
        """Record that ``stage`` finished (written atomically)."""
        state = {"finished": {**self.finished(), stage: stats or {}}}
        tmp = self.path / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.path / STATE_FILE)

    def _metric_stages(self) -> set[str]:
        f = self.path / "metrics.jsonl"
        if not f.exists():
            return set()
        return {json.loads(line)["stage"] for line in f.read_text().splitlines() if line.strip()}

    def started(self) -> set[str]:
        """Stages that left outputs here (finished or not); ``eval`` never counts."""
        out = set(self.finished()) | (self._metric_stages() & {"midtrain", "sft", "rl"})
        if latest_checkpoint(self.path) is not None or (self.path / "policy" / "rl").exists():
            out.add("rl")
        for stage in ("midtrain", "sft", "merge"):
            if (self.path / "policy" / stage).exists():
                out.add(stage)
        return out

    def remove(self, stages: list[str], *, whole_run: bool) -> None:
        """Delete the outputs of ``stages`` (their metrics rows too), or of the whole run."""
        names = [n for s in stages for n in STAGE_OUTPUTS.get(s, ()) if s != "synth" or self.default_store]
        if whole_run:
            names += list(RUN_OUTPUTS)
        for name in names:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        if not whole_run:
            self.keep_metrics(lambda row: row["stage"] not in stages)
            finished = {k: v for k, v in self.finished().items() if k not in stages}
            (self.path / STATE_FILE).write_text(json.dumps({"finished": finished}, indent=2))

    def keep_metrics(self, keep) -> None:
        """Rewrite ``metrics.jsonl`` with only the rows ``keep(row)`` accepts."""
        f = self.path / "metrics.jsonl"
        if not f.exists():
            return
        rows = [line for line in f.read_text().splitlines() if line.strip() and keep(json.loads(line))]
        f.write_text("".join(line + "\n" for line in rows))

    def plan(self, stages: list[str], *, rl_iterations: int, resume: bool, overwrite: bool) -> Plan:
        """Decide what runs; refuse (ConfigError, with the fix) a command that would mix two runs."""
        if resume and overwrite:
            raise ConfigError("--resume continues the run in run_dir and --overwrite replaces it; pass one of them")
        writing = [s for s in stages if s != "eval"]
        if overwrite:
            self.remove(writing, whole_run=set(writing) == {"synth", "sft", "rl"})
            return Plan(run=list(stages))
        started = self.started() & set(writing)
        if not resume:
            if started:
                raise ConfigError(
                    f"run_dir {str(self.path)!r} already holds {', '.join(sorted(started))} output of an earlier run; "
                    "pass --resume to continue it, --overwrite to replace it, or set another run_dir"
                )
            return Plan(run=list(stages), state=self.finished())
        return self._resume_plan(stages, started, rl_iterations)

    def _resume_plan(self, stages: list[str], started: set[str], rl_iterations: int) -> Plan:
        if not started:
            raise ConfigError(
                f"--resume: run_dir {str(self.path)!r} holds no {'/'.join(s for s in stages if s != 'eval')} output "
                "to resume (no run_state.json, no checkpoints/rl-*); run without --resume to start the run"
            )
        finished = self.finished()
        plan = Plan(run=[], state=finished)
        for s in stages:
            ckpt = latest_checkpoint(self.path) if s == "rl" else None
            if s in finished and s in ("synth", "midtrain", "sft", "merge"):
                plan.skipped[s] = "finished earlier"
            elif ckpt is not None and checkpoint_iteration(ckpt) >= rl_iterations:
                plan.skipped[s] = f"finished earlier ({ckpt} is iteration {checkpoint_iteration(ckpt)})"
            else:
                plan.run.append(s)
                plan.resume_from = ckpt if s == "rl" else plan.resume_from
        done_it = checkpoint_iteration(plan.resume_from) if plan.resume_from else 0

        def keep(row: dict[str, Any]) -> bool:
            # rows of a stage that runs again are written again, except RL's up to the checkpoint
            return row["stage"] not in plan.run or (row["stage"] == "rl" and row["step"] <= done_it)

        self.keep_metrics(keep)
        return plan
