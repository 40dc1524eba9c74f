"""Deterministic CPU stand-ins for the vision tests: a tiny patch-encoder policy and image FrozenLake."""

from __future__ import annotations

import pytest
import torch

from arborl.env.envs import FrozenLakeImage
from arborl.env.envs.frozenlake import ACTIONS
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig
from arborl.rollout.config import SamplingConfig

WORDS = ["turn", *map(str, range(1, 21)), "invalid", "goal", "hole", "solved", "timeout", "ended", *ACTIONS]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([" ".join(WORDS)], extra_words=list(ACTIONS))


@pytest.fixture(scope="module")
def vision_model(tokenizer):
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                      max_position_embeddings=1024, image_size=16, patch_size=4)
    return build_model(cfg, tokenizer, seed=0)


@pytest.fixture(scope="module")
def renderer(tokenizer, vision_model):  # vision_model first: building it adds <image> to the tokenizer
    return ChatRenderer(tokenizer)


@pytest.fixture
def policy(vision_model, renderer):
    return ModelPolicy(vision_model, renderer)


def lake(map_turns: str = "first") -> FrozenLakeImage:
    return FrozenLakeImage(size=4, map_turns=map_turns, max_steps=8)


def specs(n: int, group: int = 1) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"lake-{i}", task_type="lake", group_id=f"g{i}", seed=i)
            for i in range(n) for _ in range(group)]


def rollout_config(max_turns: int = 4, batch_size: int = 4, greedy: bool = False) -> RolloutConfig:
    return RolloutConfig(max_turns=max_turns, batch_size=batch_size,
                         sampling=SamplingConfig(max_new_tokens=3, greedy=greedy))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
