"""Deterministic CPU stand-ins for rollout tests: a fixed-length text env and a tiny random policy."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arborl.env.base import StepResult
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer

WORDS = ["go", "left", "right", "up", "down", "wait", "the", "step", "of", "is", "now", "a", "an", "board", "cell"]
SYSTEM = "you are an agent on a board"


class CountEnv:
    """Lasts exactly ``length`` turns; the action "go" is valid and earns 1, anything else earns 0.

    ``reset(options={"length": n})`` sets the length; the observation grows with the step number
    so that prompt chunks of different episodes have different lengths.
    """

    task_type = "count"

    def __init__(self, length: int = 3) -> None:
        self.length = length
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.length = int((options or {}).get("length", self.length))
        self.seed = seed or 0
        self.t = 0
        return self._obs(), {}

    def _obs(self) -> str:
        extra = " ".join(WORDS[(self.seed + i) % len(WORDS)] for i in range(self.t + self.seed % 3))
        return f"step {self.t} of board {extra}".strip()

    def step(self, action: str) -> StepResult:
        valid = action.strip() == "go"
        self.t += 1
        done = self.t >= self.length
        info = {"action_valid": valid, "action": action.strip() if valid else None}
        if done:
            info["success"] = True
        return StepResult(obs=self._obs(), reward=1.0 if valid else 0.0, terminated=done, info=info)

    def format_observation(self, obs: Any) -> str:
        return str(obs)

    def state_key(self) -> tuple[int, int]:
        return (self.length, self.t)

    def expert_action(self) -> str:
        return "go"

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer([SYSTEM, " ".join(WORDS), "0 1 2 3 4 5 6 7 8 9"])


@pytest.fixture(scope="session")
def renderer(tokenizer):
    return ChatRenderer(tokenizer, SYSTEM)


@pytest.fixture(scope="session")
def model(tokenizer):
    return build_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                   intermediate_size=128, max_position_embeddings=1024), tokenizer, seed=0)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the threads' barriers
    make every small op wait for a descheduled thread (measured 10x slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
