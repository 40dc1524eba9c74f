"""A test-only env whose steps are not a function of seed and actions (a re-play cannot rebuild it)."""

from __future__ import annotations

import os
from typing import Any

from arborl.env.base import StepResult


class Flaky:
    """Five turns; each observation is the worker's process id, so a restarted worker shows another."""

    task_type = "flaky"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.t = 0
        return f"pid {os.getpid()} turn 0", {}

    def step(self, action: str) -> StepResult:
        self.t += 1
        info = {"action_valid": True, **({"success": True} if self.t >= 5 else {})}
        return StepResult(f"pid {os.getpid()} turn {self.t}", 0.0, self.t >= 5, False, info)

    def format_observation(self, obs: Any) -> str:
        return str(obs)

    def state_key(self) -> int:
        return self.t

    def close(self) -> None:
        pass
