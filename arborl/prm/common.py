"""Pieces both reward models share: copying the policy, per-step positions and sums, minibatches."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from arborl.train.batch import TokenBatch, length_chunks


def trainable_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``policy`` with gradients on, in eval mode (no dropout: scores are deterministic)."""
    return copy.deepcopy(policy).eval().requires_grad_(True)


def step_sums(values: Tensor, step_of_token: Tensor, n_steps: int) -> Tensor:
    """``[N]`` sum of ``values`` (``[B, T]``) over the tokens of each step (padding, step -1, ignored)."""
    real = step_of_token >= 0
    out = values.new_zeros(n_steps)
    return out.index_add(0, step_of_token[real], values[real])


def last_token_of_steps(step_of_token: Tensor, n_steps: int) -> Tensor:
    """``[N]`` flat index (``b * T + t``) of the last token of each step; -1 for a step not in the batch."""
    flat = step_of_token.reshape(-1)
    pos = torch.arange(flat.numel())
    real = flat >= 0
    out = torch.full((n_steps,), -1, dtype=torch.long)
    return out.scatter_reduce(0, flat[real], pos[real], "amax")


def minibatches(batch: TokenBatch, size: int, gen: torch.Generator) -> list[Tensor]:
    """Row chunks of similar lengths (:func:`~arborl.train.batch.length_chunks`) in a random order."""
    chunks = length_chunks(batch, size)
    return [chunks[i] for i in torch.randperm(len(chunks), generator=gen).tolist()]


def outcome(score: float | None) -> float:
    """An episode's 0/1 outcome from its score (``None`` and anything <= 0 count as failure)."""
    return 1.0 if score is not None and score > 0 else 0.0
