"""Trajectory filters: pure functions from a :class:`StepBatch` to the mask of groups to train on.

A filter runs before the credit estimator: :func:`credit_on_groups` hands the estimator the
kept groups only (ids made dense again), so every batch-wide statistic (the mean episode length
of ``length_neutral``, for one) is taken over what is trained, and the dropped groups get
advantage 0 and leave the update.

* :func:`starpo_s_groups` — StarPO-S's uncertainty filter (RAGEN, Wang et al. 2025): keep the
  ``keep_ratio`` of groups whose scores vary most within the group.

Departures from RAGEN's code, on purpose (docs/credit.md §5): the number kept is
``ceil(keep_ratio * groups)``, so a non-zero ratio never keeps zero groups by rounding; ties in
the std are broken by group id (a stable sort), not left to ``topk``; the groups need not be
contiguous or complete; a group of one sampled episode has std 0, not NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from arborl.credit.advantages import _segment_mean_std
from arborl.credit.estimators import StepBatch

ZERO_STD = 1e-10
"""A group whose score std is at most this counts as having no spread (RAGEN's threshold)."""


def _n_groups(batch: StepBatch) -> int:
    return int(batch.group.max().item()) + 1 if batch.group.numel() else 0


def _sampled(batch: StepBatch) -> Tensor:
    return torch.ones_like(batch.group, dtype=torch.bool) if batch.sampled is None else batch.sampled


def group_score_std(batch: StepBatch) -> Tensor:
    """``[G]`` unbiased std of the sampled episodes' scores in each group (0 for fewer than two)."""
    sampled = _sampled(batch)
    # a group of one has no spread: its deviation from its own mean is 0 (torch.std would give NaN)
    return _segment_mean_std(batch.score.to(torch.float64)[sampled], batch.group[sampled], _n_groups(batch))[2]


def keep_count(keep_ratio: float, n_groups: int) -> int:
    """How many groups a ratio keeps: ``ceil(keep_ratio * n_groups)`` (float noise ignored)."""
    return min(n_groups, math.ceil(keep_ratio * n_groups - 1e-9))


def starpo_s_groups(batch: StepBatch, *, keep_ratio: float, keep_zero_std: bool = True) -> Tensor:
    """StarPO-S filter: the groups whose episode scores vary most.

    Groups are ranked by the std of their sampled episodes' scores (largest first; equal stds in
    group-id order) and the first ``ceil(keep_ratio * G)`` are kept. With ``keep_zero_std`` false,
    groups without spread are never kept, so a batch in which every group agrees keeps nothing:
    the selection is then empty, which the caller reports.

    Args:
        batch: The steps; only ``group``, ``score`` and ``sampled`` are read.
        keep_ratio: Fraction of groups to keep, in (0, 1].
        keep_zero_std: Whether a group whose scores are all equal may be kept.

    Returns:
        ``[G]`` bool, the kept groups.
    """
    if not 0 < keep_ratio <= 1:
        raise ValueError(f"keep_ratio is {keep_ratio}; use a fraction in (0, 1]")
    std = group_score_std(batch)
    order = torch.sort(-std, stable=True).indices
    keep = torch.zeros(std.numel(), dtype=torch.bool)
    keep[order[: keep_count(keep_ratio, std.numel())]] = True
    return keep if keep_zero_std else keep & (std > ZERO_STD)


def starpo_s_groups_reference(batch: StepBatch, *, keep_ratio: float, keep_zero_std: bool = True) -> list[bool]:
    """Slow loop version of :func:`starpo_s_groups`, for tests."""
    groups: dict[int, list[float]] = {}
    n_groups = _n_groups(batch)
    sampled = _sampled(batch).tolist()
    for g, s, ok in zip(batch.group.tolist(), batch.score.tolist(), sampled, strict=True):
        if ok:
            groups.setdefault(g, []).append(s)
    stds = []
    for g in range(n_groups):
        vals = groups.get(g, [])
        mean = sum(vals) / len(vals) if vals else 0.0
        stds.append((sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0)
    ranked = sorted(range(n_groups), key=lambda g: (-stds[g], g))
    top = set(ranked[: keep_count(keep_ratio, n_groups)])
    return [g in top and (keep_zero_std or stds[g] > ZERO_STD) for g in range(n_groups)]


def credit_on_groups(estimator: Callable[..., Tensor], batch: StepBatch, keep_groups: Tensor,
                     **extra: Tensor) -> Tensor:
    """Run ``estimator`` on the episodes of the kept groups only; every other step gets 0.

    Args:
        estimator: A credit estimator (``StepBatch -> [N]`` advantages).
        batch: The whole batch.
        keep_groups: ``[G]`` bool, e.g. from :func:`starpo_s_groups`.
        **extra: Tensors a credit model produced, passed on as keyword arguments: ``[N]`` ones
            (one per step row; this reading wins when N equals E) are cut to the kept steps,
            ``[E]`` ones to the kept episodes.

    Returns:
        ``[N]`` float32 step advantages of ``batch``.
    """
    keep = keep_groups[batch.group] if batch.group.numel() else torch.zeros(0, dtype=torch.bool)
    if bool(keep.all()):
        return estimator(batch, **extra)
    out = torch.zeros(batch.episode.numel(), dtype=torch.float32)
    if bool(keep.any()):
        sub, rows = batch.select_episodes(keep)
        n = batch.episode.numel()
        cut = {k: v[rows] if v.shape[0] == n else v[keep] for k, v in extra.items()}
        out[rows] = estimator(sub, **cut).to(torch.float32)
    return out
