"""Critic losses as pure tensor functions: PPO's clipped value loss (``clip=None``: the plain
squared error that ArCHer's TD regression uses) and the explained variance of a critic.

Values are one per turn (``[N]``), not per token: a turn-level critic predicts ``V(s_h)`` once
per turn, and the mean is over turns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arborl.loss.policy import LossOutput


def _mean(x: Tensor) -> Tensor:
    return x.mean() if x.numel() else x.sum()


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *, clip: float | None = 0.5) -> LossOutput:
    """``0.5 * mean(max((V - G)^2, (clip(V, V_old +- clip) - G)^2))`` (PPO's value loss, verl's ``cliprange_value``).

    Args:
        values: ``[N]`` current critic values (with grad).
        old_values: ``[N]`` the values when the targets were computed (no grad).
        returns: ``[N]`` targets ``G``.
        clip: How far a value may move from ``old_values`` before its gradient stops (None: plain MSE).

    Returns:
        The loss, with ``critic/loss`` and ``critic/clip_frac`` (fraction of turns where the clipped
        branch was the larger).
    """
    err = (values - returns) ** 2
    if clip is None:
        loss = 0.5 * _mean(err)
        return LossOutput(loss, {"critic/loss": float(loss.detach()), "critic/clip_frac": 0.0})
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    err_clipped = (clipped - returns) ** 2
    loss = 0.5 * _mean(torch.maximum(err, err_clipped))
    frac = float((err_clipped > err).to(torch.float32).mean()) if err.numel() else 0.0
    return LossOutput(loss, {"critic/loss": float(loss.detach()), "critic/clip_frac": frac})


def explained_variance(pred: Tensor, target: Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)`` (1: perfect, 0: no better than the mean; nan when Var is 0)."""
    var = torch.var(target.to(torch.float64), unbiased=False)
    if target.numel() < 2 or float(var) == 0.0:
        return float("nan")
    return float(1.0 - torch.var((target - pred).to(torch.float64), unbiased=False) / var)
