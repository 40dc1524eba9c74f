"""What to merge and how: the ``[merge]`` config section, also built by ``arborl merge`` from its flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from arborl.config import ConfigError

METHODS = ("linear", "slerp", "task_arithmetic", "ties", "dare")
"""Merge methods (see :mod:`arborl.merge.methods`)."""

NEEDS_BASE = ("task_arithmetic", "ties", "dare")
"""Methods that add task vectors ``theta_i - base`` to a base checkpoint."""


@dataclass(frozen=True)
class MergeConfig:
    """Merge Hugging Face checkpoints of one architecture into one (the ``merge`` stage)."""

    method: Literal["linear", "slerp", "task_arithmetic", "ties", "dare"] = "linear"
    """``linear`` (weighted average), ``slerp`` (two models, at ``t``), ``task_arithmetic``, ``ties`` or
    ``dare`` (these three add task vectors ``model - base`` to ``base``)."""
    models: list[str] = field(default_factory=lambda: ["sft", "rl"])
    """Checkpoints to merge: a directory, or the name of one of the run's policies (``init``, ``midtrain``,
    ``sft``, ``rl``: ``run_dir/policy/<name>``)."""
    base: str = ""
    """Base checkpoint of task_arithmetic, ties and dare (directory or run policy name, e.g. ``sft``)."""
    weights: list[float] = field(default_factory=list)
    """One weight per model ([]: equal weights, ``1/N`` each)."""
    t: float = 0.5
    """slerp: interpolation factor, 0 = first model, 1 = second."""
    density: float = 1.0
    """ties and dare: fraction of each task vector kept (ties: by magnitude; dare: at random, rescaled)."""
    scale: float = 1.0
    """ties: factor of the merged task vector (the paper's lambda)."""
    seed: int = 0
    """dare: seed of the drop masks (a tensor's masks depend on the seed, the tensor's name and, for a tensor
    merged in row slices, the slice only)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"merge.method = {self.method!r} is unknown; choose one of {list(METHODS)}")
        if len(self.models) < 2 and not (self.method in NEEDS_BASE and self.models):
            raise ConfigError(f"merge.models lists {len(self.models)} checkpoint(s); {self.method} merges at least two")
        if self.method == "slerp" and len(self.models) != 2:
            raise ConfigError(f"merge.method = slerp interpolates exactly two models; merge.models lists {len(self.models)}")
        if self.weights and len(self.weights) != len(self.models):
            raise ConfigError(f"merge.weights has {len(self.weights)} values for {len(self.models)} models; give one per "
                              "model or none (equal weights)")
        if self.method in NEEDS_BASE and not self.base:
            raise ConfigError(f"merge.method = {self.method} adds task vectors to a base; set merge.base (--base), e.g. the "
                              "SFT checkpoint the models were trained from")
        if not 0.0 <= self.t <= 1.0:
            raise ConfigError(f"merge.t = {self.t} is outside [0, 1]; 0 gives the first model, 1 the second")
        if not 0.0 < self.density <= 1.0:
            raise ConfigError(f"merge.density = {self.density} is outside (0, 1]; it is the fraction of entries kept")

    def resolved_weights(self) -> list[float]:
        """``weights``, or ``1/N`` for each of the N models."""
        return list(self.weights) if self.weights else [1.0 / len(self.models)] * len(self.models)
