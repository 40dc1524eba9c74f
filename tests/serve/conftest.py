"""A tiny checkpoint built from a config, served on a free loopback port, and the official OpenAI client."""

from __future__ import annotations

import pytest
import torch

from arborl.policy import ModelConfig, build_model, save_policy, train_tokenizer

WORDS = ["go", "left", "right", "up", "down", "wait", "the", "step", "of", "is", "now", "a", "board", "cell", "you", "are", "an", "agent"]
TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                   max_position_embeddings=256)


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer([" ".join(WORDS), "0 1 2 3 4 5 6 7 8 9"])


def write_checkpoint(path, tokenizer, seed: int):
    return save_policy(build_model(TINY, tokenizer, seed=seed), tokenizer, path)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", tokenizer, seed=0)


@pytest.fixture(scope="session")
def checkpoint_b(tmp_path_factory, tokenizer):
    """Another model over the same tokenizer (the trainer's next weights)."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-b", tokenizer, seed=1)


@pytest.fixture
def served(checkpoint):
    from arborl.serve import ServedModel

    return ServedModel(checkpoint, device="cpu")


@pytest.fixture
def server(served):
    from arborl.serve import PolicyServer

    with PolicyServer(served) as s:
        yield s


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
