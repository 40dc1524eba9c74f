"""Pieces every stage shares: env construction, the run directory, metrics, checkpoints, RNG state."""

from __future__ import annotations

import importlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arborl.config import ConfigError
from arborl.env import Env
from arborl.train.config import EnvSpec

METRICS = {
    "stage": "which stage wrote the row (sft, rl, eval)",
    "step": "optimizer step (sft) or iteration (rl) within the stage",
    "env_steps": "environment steps of experience consumed so far in the run (demonstrations + rollouts)",
    "success": "fraction of evaluated episodes with rewards['success'] > 0 (greedy, held-out tasks)",
    "reward": "mean episode return (sum of env rewards) on the same evaluation",
    "train/success": "success rate of the group rollouts of this RL iteration (sampling, training tasks; no branches)",
    "train/branches": "branch episodes rolled out this iteration (rl.branch: untried actions at visited states)",
    "train/invalid_frac": "fraction of turns whose action did not parse",
    "train/turns": "mean turns per rollout episode",
    "train/adv_abs": "mean |advantage| over trained tokens",
    "train/kept_frac": "fraction of rollouts with a non-zero advantage somewhere (the ones the update uses)",
    "tokens": "model-generated tokens so far",
    "loss/*, diag/*": "see arborl.loss.policy",
}
"""Every metric name written to metrics.jsonl / TensorBoard, with its meaning."""


def import_object(path: str, *, key: str) -> Any:
    """Import ``package.module:Name``; errors name the config ``key`` and the fix."""
    if ":" not in path:
        raise ConfigError(f"{key} = {path!r} must look like 'package.module:ClassName'")
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"{key} = {path!r}: cannot import module {mod_name!r} ({e}); is it installed and on PYTHONPATH?") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"{key} = {path!r}: module {mod_name!r} has no attribute {attr!r}") from None


def env_factory(spec: EnvSpec) -> Callable[[], Env]:
    """A zero-argument constructor of the configured environment."""
    cls = import_object(spec.cls, key="env.cls")
    kwargs = dict(spec.kwargs)

    def make() -> Env:
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"env.kwargs {kwargs} do not fit {spec.cls}: {e}") from e

    return make


def task_type_of(env: Env) -> str:
    return str(getattr(env, "task_type", type(env).__name__.lower()))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG stream a stage uses, for exact resume."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])


class Metrics:
    """Appends rows to ``metrics.jsonl`` and TensorBoard event files in the run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tb"))
        except ImportError:  # tensorboard is a declared dependency; keep the JSONL log regardless
            self._tb = None

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        row = {"stage": stage, "step": step, "time": time.time(), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, int | float):
                    self._tb.add_scalar(f"{stage}/{k}", v, step)

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def save_trainer_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_trainer_state(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"no trainer state at {path}; the checkpoint is incomplete, start without --resume")
    return torch.load(path, weights_only=False)
