"""Configuration of the rollout: sampling, episode budgets, and the episodes to run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from arborl.trajectory.schema import Origin, Turn


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn from the policy."""

    temperature: float = 1.0
    """Logits are divided by it before sampling; recorded log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables truncation. Recorded log-probs ignore it."""
    max_new_tokens: int = 32
    """Most tokens sampled per turn, end-of-turn token included; a turn cut at this budget gets one
    extra, forced end-of-turn token (mask 0, log-prob 0)."""
    greedy: bool = False
    """Take the most likely token; log-probs are then recorded at temperature 1."""

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(
                f"SamplingConfig.temperature is {self.temperature!r}; use a positive number "
                "(set greedy=True for argmax decoding)"
            )
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise ValueError(f"SamplingConfig.top_p is {self.top_p!r}; use a number in (0, 1] (1 disables it)")
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens is {self.max_new_tokens!r}; use an integer >= 1")

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the recorded behaviour log-probs (and of the trainer's recomputation)."""
        return 1.0 if self.greedy else float(self.temperature)


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and shaping of multi-turn episodes."""

    max_turns: int = 8
    """Turns per episode before it stops with stop_reason "max_turns"."""
    max_context_tokens: int = 2048
    """Longest token sequence of an episode; a turn whose prompt plus max_new_tokens would not fit
    is not started and the episode stops with stop_reason "max_context"."""
    invalid_action_penalty: float = 0.0
    """Added to a turn's reward when the env reports ``info["action_valid"] is False`` (<= 0)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Token sampling."""
    batch_size: int = 64
    """Most episodes generated together (one forward pass per decoding step)."""
    env_workers: int = 8
    """Threads that step the environments of a turn concurrently (a turn's env phase lasts as long as
    its slowest step, not the sum). Envs of one batch must not share unsynchronised state; 1 steps
    them one at a time (still on a worker thread, under the deadline)."""
    env_timeout_s: float = 600.0
    """Deadline of one ``reset`` or ``step`` (with ``format_observation`` and ``state_key``): an env
    call that does not return in time ends its episode with stop_reason "env_error"."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_context_tokens", "batch_size", "env_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RolloutConfig.{name} is {value!r}; use an integer >= 1")
        if not (isinstance(self.env_timeout_s, int | float) and math.isfinite(self.env_timeout_s)
                and self.env_timeout_s > 0):
            raise ValueError(f"RolloutConfig.env_timeout_s is {self.env_timeout_s!r}; use a positive number of seconds")
        p = self.invalid_action_penalty
        if not (isinstance(p, int | float) and math.isfinite(p) and p <= 0):
            raise ValueError(
                f"RolloutConfig.invalid_action_penalty is {p!r}; use a finite number <= 0 (it is added to the "
                "reward of an invalid action, e.g. -0.1)"
            )
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError("RolloutConfig.sampling must be a SamplingConfig")
        if self.sampling.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"RolloutConfig.max_context_tokens ({self.max_context_tokens}) must exceed sampling.max_new_tokens "
                f"({self.sampling.max_new_tokens}); raise max_context_tokens or lower max_new_tokens"
            )


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: which task, which group, which seed."""

    task_id: str
    """Task instance id (episodes of one task share it)."""
    task_type: str
    """Capability bucket, e.g. "frozenlake"."""
    group_id: str
    """Rollout group whose episodes are compared with each other (GRPO group)."""
    seed: int
    """Seed passed to ``env.reset``."""
    options: dict[str, Any] | None = None
    """Options passed to ``env.reset``."""
    prefix: tuple[Turn, ...] = ()
    """A trunk's turns this episode starts with: shared (the same Turn objects, never generated
    again), their actions re-played in the env to reach the state the episode continues from."""
    origin: Origin | None = None
    """Recorded as ``Episode.origin`` (which trunk, which turn, branch or tree); set with ``prefix``."""
    branch_action: str | None = None
    """Action text forced as the turn after ``prefix`` (trained on, mask 1); the policy samples
    from there on. Used to try every action of a finite action set at a visited state."""
    metadata: dict[str, Any] | None = None
    """Copied into ``Episode.metadata``."""
