"""Advantage estimators as pure tensor functions (no env, rollout or policy imports).

Layout: a batch is a flat list of *steps* (one per turn along each episode's path). Each step
knows its episode (``episode[N]``), its position in the episode (``step[N]``), and each episode
knows its group (``group[E]``, the GRPO group: rollouts of one task from one initial state).
Integer ids are 0-based and dense; ``anchor[N]`` is an integer code of the environment state
the step acted from (equal codes = equal states), used by GiGPO.

Every vectorised estimator has a slow ``*_reference`` loop beside it; the tests check that they
agree on random inputs.

Departures from the papers / reference code, on purpose (see docs/credit.md §2, §3):

* GRPO group statistics are taken over *trajectories*, not over step rows (verl-agent's
  ``compute_mean_std_cross_steps=True`` weights long episodes by their length).
* std is the unbiased (Bessel) estimate, eps = 1e-6, and an all-equal group gets A = 0. A
  singleton group gets A = R by default (``singleton="raw"``: mean 0, std 1, verl's rule) or 0
  (``singleton="zero"``: a trajectory with no peer has no baseline, so no signal).
* RLOO's leave-one-out mean is the exact ``R_i - mean_{j != i} R_j``, never divided by a std.
* GiGPO (Feng et al. 2025, Eq. 5-8): a singleton anchor-state group gets A^S = 0 (Eq. 7).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _segment_mean_std(values: Tensor, seg: Tensor, n_seg: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment count, mean and unbiased std of ``values`` (float)."""
    count = torch.zeros(n_seg, dtype=values.dtype, device=values.device).index_add_(
        0, seg, torch.ones_like(values)
    )
    total = torch.zeros(n_seg, dtype=values.dtype, device=values.device).index_add_(0, seg, values)
    mean = total / count.clamp_min(1)
    dev2 = (values - mean[seg]) ** 2
    ss = torch.zeros(n_seg, dtype=values.dtype, device=values.device).index_add_(0, seg, dev2)
    std = torch.sqrt(ss / (count - 1).clamp_min(1))
    return count, mean, std


SINGLETON_RULES = ("raw", "zero")
"""What a group of one episode gets: ``raw`` (``A = R``, verl's rule) or ``zero`` (no peer, no signal)."""


def _check_singleton(singleton: str) -> None:
    if singleton not in SINGLETON_RULES:
        raise ValueError(f"singleton = {singleton!r} is unknown; choose one of {list(SINGLETON_RULES)}")


def grpo_advantages(
    scores: Tensor, group: Tensor, *, norm_by_std: bool = True, eps: float = 1e-6, singleton: str = "raw"
) -> Tensor:
    """Group-relative advantage per episode (GRPO, Shao et al. 2024; verl's outcome estimator).

    Args:
        scores: ``[E]`` float, the episode score (e.g. success or return).
        group: ``[E]`` long, dense group ids.
        norm_by_std: Divide by the group std (False gives Dr.GRPO's ``R - mean``).
        eps: Added to the std.
        singleton: A group of one episode gets ``A = R`` (``raw``: mean 0, std 1) or 0 (``zero``).

    Returns:
        ``[E]`` advantages; an all-equal group gets 0.
    """
    _check_singleton(singleton)
    scores = scores.to(torch.float64)
    n_seg = int(group.max().item()) + 1 if group.numel() else 0
    count, mean, std = _segment_mean_std(scores, group, n_seg)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean[group]
    if norm_by_std:
        adv = adv / (std[group] + eps)
    if singleton == "zero":
        adv = torch.where(single[group], torch.zeros_like(adv), adv)
    return adv.to(torch.float32)


def rloo_advantages(scores: Tensor, group: Tensor, *, singleton: str = "raw") -> Tensor:
    """Leave-one-out advantage per episode (RLOO, Ahmadian et al. 2024): ``R_i - mean_{j != i} R_j``.

    Equal to ``n / (n - 1) * (R_i - mean(R))`` for a group of ``n``; no std normalisation.

    Args:
        scores: ``[E]`` float, the episode score.
        group: ``[E]`` long, dense group ids.
        singleton: A group of one episode (no one to leave out) gets ``A = R`` (``raw``) or 0 (``zero``).

    Returns:
        ``[E]`` float32 advantages; an all-equal group gets 0.
    """
    _check_singleton(singleton)
    vals = scores.to(torch.float64)
    n_seg = int(group.max().item()) + 1 if group.numel() else 0
    count, mean, _ = _segment_mean_std(vals, group, n_seg)
    n = count[group]
    loo = n / (n - 1).clamp_min(1) * (vals - mean[group])
    lone = vals if singleton == "raw" else torch.zeros_like(vals)
    return torch.where(n <= 1, lone, loo).to(torch.float32)


def _members(ids: list[int]) -> dict[int, list[int]]:
    """Positions of each id (the reference loops' grouping)."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    return members


def grpo_advantages_reference(
    scores: list[float], group: list[int], *, norm_by_std: bool = True, eps: float = 1e-6, singleton: str = "raw"
) -> list[float]:
    """Slow loop version of :func:`grpo_advantages`, for tests."""
    out = [0.0] * len(scores)
    for idx in _members(group).values():
        vals = [scores[i] for i in idx]
        if len(vals) == 1:
            if singleton == "raw":
                out[idx[0]] = vals[0] / (1.0 + eps) if norm_by_std else vals[0]
            continue
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
        for i in idx:
            a = scores[i] - mean
            out[i] = a / (std + eps) if norm_by_std else a
    return out


def rloo_advantages_reference(scores: list[float], group: list[int], *, singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`rloo_advantages`: the mean of the others, computed by leaving each out."""
    out = [0.0] * len(scores)
    for idx in _members(group).values():
        for i in idx:
            others = [scores[j] for j in idx if j != i]
            if others:
                out[i] = scores[i] - sum(others) / len(others)
            elif singleton == "raw":
                out[i] = scores[i]
    return out


def discounted_returns(rewards: Tensor, episode: Tensor, step: Tensor, *, gamma: float) -> Tensor:
    """Reward-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k`` within each episode (GiGPO Eq. 5).

    Args:
        rewards: ``[N]`` step rewards.
        episode: ``[N]`` episode id of each step.
        step: ``[N]`` position of each step in its episode (0-based, contiguous).
        gamma: Discount.

    Returns:
        ``[N]`` returns, float32. Truncated episodes are not bootstrapped.
    """
    n = rewards.numel()
    if n == 0:
        return rewards.to(torch.float32)
    # Sort by (episode, step); then G of a row = its reward + gamma * G of the next row of its
    # episode. Rows are processed in waves of equal steps-to-go, so a wave only reads rows done
    # in the previous one: as many vector steps as the longest episode has turns, O(N) memory.
    ep = episode.to(torch.int64)
    key = ep * (int(step.max().item()) + 1) + step.to(torch.int64)
    order = torch.argsort(key)
    r, ep = rewards.to(torch.float64)[order], ep[order]
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = ep[1:] != ep[:-1]
    ends = torch.roll(starts, -1)  # the last row of each episode
    first = torch.cummax(torch.where(starts, torch.arange(n), 0), 0).values  # row where its episode starts
    length = torch.zeros(n, dtype=torch.int64).index_add_(0, first, torch.ones(n, dtype=torch.int64))
    to_go = length[first] - 1 - (torch.arange(n) - first)
    nxt = torch.where(ends, n, torch.arange(n) + 1)  # row n holds the 0 after an episode's end
    g = torch.zeros(n + 1, dtype=torch.float64)
    waves = torch.argsort(to_go, stable=True).split(torch.bincount(to_go).tolist())
    for rows in waves:
        g[rows] = r[rows] + gamma * g[nxt[rows]]
    result = torch.empty(n, dtype=torch.float64)
    result[order] = g[:n]
    return result.to(torch.float32)


def step_group_advantages(
    returns: Tensor, step_group: Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GiGPO step-level advantage A^S within anchor-state groups (Eq. 7).

    Args:
        returns: ``[N]`` discounted returns of each step.
        step_group: ``[N]`` dense ids of (episode group, anchor state) pairs.
        norm_by_std: ``mean_std_norm`` (True) or ``mean_norm`` (False).
        eps: Added to the std.

    Returns:
        ``[N]`` advantages; a singleton step group gets 0.
    """
    vals = returns.to(torch.float64)
    n_seg = int(step_group.max().item()) + 1 if step_group.numel() else 0
    count, mean, std = _segment_mean_std(vals, step_group, n_seg)
    adv = vals - mean[step_group]  # singleton: value - itself = 0
    if norm_by_std:
        adv = adv / (std[step_group] + eps)
    adv = torch.where(count[step_group] <= 1, torch.zeros_like(adv), adv)
    return adv.to(torch.float32)


def step_group_advantages_reference(
    returns: list[float], step_group: list[int], *, norm_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Slow loop version of :func:`step_group_advantages`, for tests."""
    out = [0.0] * len(returns)
    for idx in _members(step_group).values():
        if len(idx) == 1:
            continue
        vals = [returns[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
        for i in idx:
            a = returns[i] - mean
            out[i] = a / (std + eps) if norm_by_std else a
    return out


def best_return_weights(returns: Tensor, step_group: Tensor, *, tol: float = 1e-6) -> Tensor:
    """Greedy policy-improvement targets within state groups.

    In each group, the steps whose return is within ``tol`` of the group's best share weight 1
    (``1 / count`` each) and every other step gets 0; a group whose returns are all equal
    (including a singleton) gets 0 everywhere, since it cannot tell actions apart.

    Args:
        returns: ``[N]`` returns of each step (Monte-Carlo estimates of ``Q(s, a)``).
        step_group: ``[N]`` dense ids of the state groups.
        tol: Returns closer than this count as equal.

    Returns:
        ``[N]`` float32 weights in [0, 1]; each informative group sums to 1.
    """
    vals = returns.to(torch.float64)
    n_seg = int(step_group.max().item()) + 1 if step_group.numel() else 0
    best = torch.full((n_seg,), float("-inf"), dtype=vals.dtype).scatter_reduce(0, step_group, vals, "amax")
    worst = torch.full((n_seg,), float("inf"), dtype=vals.dtype).scatter_reduce(0, step_group, vals, "amin")
    is_best = (vals >= best[step_group] - tol) & ((best - worst) > tol)[step_group]
    count = torch.zeros(n_seg, dtype=vals.dtype).index_add_(0, step_group, is_best.to(vals.dtype))
    return torch.where(is_best, 1.0 / count[step_group].clamp_min(1), torch.zeros_like(vals)).to(torch.float32)


def best_return_weights_reference(returns: list[float], step_group: list[int], *, tol: float = 1e-6) -> list[float]:
    """Slow loop version of :func:`best_return_weights`, for tests."""
    out = [0.0] * len(returns)
    for idx in _members(step_group).values():
        vals = [returns[i] for i in idx]
        if max(vals) - min(vals) <= tol:
            continue
        top = [i for i in idx if returns[i] >= max(vals) - tol]
        for i in top:
            out[i] = 1.0 / len(top)
    return out


def dense_ids(*keys: Tensor) -> Tensor:
    """Map rows of equal key tuples to dense 0-based ids (first appearance order not kept).

    The keys are folded into one int64 code column by column (each id times the next key's range,
    plus that key), so a single 1-D ``unique`` does the work; a 2-D row ``unique`` sorts whole
    rows and is ~10x slower. Keys too wide to fold fall back to it.
    """
    ids = torch.unique(keys[0].to(torch.int64), return_inverse=True)[1]
    for k in keys[1:]:
        k = k.to(torch.int64)
        if not k.numel():
            return ids
        lo, span = int(k.min()), int(k.max()) - int(k.min()) + 1
        if (int(ids.max()) + 1) * span >= 2**62:
            stacked = torch.stack([ids, k], dim=1)
            ids = torch.unique(stacked, dim=0, return_inverse=True)[1]
        else:
            ids = torch.unique(ids * span + (k - lo), return_inverse=True)[1]
    return ids
