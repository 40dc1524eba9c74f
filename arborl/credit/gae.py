"""Turn-level critic estimators: Turn-PPO's GAE over turns, and ArCHer's ``Q - V``.

The turn is the MDP step: state ``s_h`` is everything the model read before writing turn ``h``,
the action is the whole turn. A critic (``arborl.critics``) gives one value per step row; these
functions only do the arithmetic, over :class:`~arborl.credit.StepBatch` plus those tensors.

Turn-level GAE (:func:`turn_gae`), right to left within each episode::

    delta_h = r_h + gamma * V_{h+1} - V_h
    A_h     = delta_h + gamma * lam * A_{h+1}
    G_h     = A_h + V_h                      (the critic's target, before any whitening)

with ``V_{H+1}`` the episode's bootstrap value when it was *truncated* (a turn or context budget
ran out: the state after it still had a future) and 0 when it *terminated*. Only turns enter the
recursion, so observation and tool tokens take no GAE step and no reward is dropped.

Optional whitening (``whiten``) standardises the advantages over the batch with statistics in
which every *episode* weighs the same (each turn ``1 / turns_of_its_episode``): with per-turn (or
per-token) statistics a long episode would move the batch mean by its number of turns, i.e. the
baseline would depend on the trajectory's own length (verl RFC #7244).
"""

from __future__ import annotations

import torch
from torch import Tensor

from arborl.credit.advantages import discounted_returns
from arborl.credit.estimators import StepBatch

WHITEN_EPS = 1e-8
"""Added to the variance before the square root when whitening (verl's ``masked_whiten``)."""


def next_values(batch: StepBatch, values: Tensor, bootstrap: Tensor) -> Tensor:
    """``[N]`` the value of the state after each step: the next step's value, or ``bootstrap[e]`` after the last.

    Args:
        batch: The steps (``step`` 0-based and contiguous within each episode).
        values: ``[N]`` value of each step's state.
        bootstrap: ``[E]`` value after each episode's last step (0 for a terminated episode).
    """
    n = batch.episode.numel()
    if n == 0:
        return values.to(torch.float32)
    ep = batch.episode.to(torch.int64)
    order = torch.argsort(ep * (int(batch.step.max()) + 1) + batch.step.to(torch.int64))
    v, ep_sorted = values.to(torch.float64)[order], ep[order]
    last = torch.ones(n, dtype=torch.bool)
    last[:-1] = ep_sorted[1:] != ep_sorted[:-1]
    shifted = torch.cat([v[1:], v.new_zeros(1)])
    nxt = torch.where(last, bootstrap.to(torch.float64)[ep_sorted], shifted)
    out = torch.empty(n, dtype=torch.float64)
    out[order] = nxt
    return out.to(torch.float32)


def turn_gae_returns(batch: StepBatch, *, values: Tensor, episode_next_value: Tensor, episode_truncated: Tensor,
                     gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Turn-level GAE advantages and the critic's targets, before whitening.

    Args:
        batch: The steps; ``reward`` is ``r_h``.
        values: ``[N]`` critic value ``V(s_h)`` of each step's state.
        episode_next_value: ``[E]`` value of the state after each episode's last turn.
        episode_truncated: ``[E]`` bool: the episode was cut by a budget (bootstrap from
            ``episode_next_value``) rather than terminated (no bootstrap).
        gamma: Discount per turn.
        lam: GAE's lambda (1: Monte-Carlo return minus ``V``; 0: one-step TD error).

    Returns:
        ``(advantages, returns)``, both ``[N]`` float32.
    """
    bootstrap = torch.where(episode_truncated.to(torch.bool), episode_next_value.to(torch.float32),
                            torch.zeros_like(episode_next_value, dtype=torch.float32))
    v = values.to(torch.float32)
    delta = batch.reward.to(torch.float32) + gamma * next_values(batch, v, bootstrap) - v
    adv = discounted_returns(delta, batch.episode, batch.step, gamma=gamma * lam)
    return adv, adv + v


def episode_weights(batch: StepBatch) -> Tensor:
    """``[N]`` weight of each step in batch statistics: ``1 / active turns of its episode`` (0 if inactive)."""
    turns = batch.turns_per_episode().clamp_min(1)
    return batch.step_active().to(torch.float32) / turns[batch.episode]


def whiten_by_episode(adv: Tensor, batch: StepBatch, *, eps: float = WHITEN_EPS) -> Tensor:
    """``(A - mean) / sqrt(var + eps)`` over the active steps, every episode weighing the same.

    The mean and the (unbiased, in the number of episodes) variance are weighted by
    :func:`episode_weights`; inactive steps get 0. With a single episode there is no spread to
    divide by: only the mean is removed.
    """
    w = episode_weights(batch).to(torch.float64)
    total = w.sum()
    if total <= 0:
        return torch.zeros_like(adv, dtype=torch.float32)
    a = adv.to(torch.float64)
    mean = (w * a).sum() / total
    n_eps = int((batch.turns_per_episode() > 0).sum())  # each contributes weight 1 in all
    var = (w * (a - mean) ** 2).sum() / (n_eps - 1) if n_eps > 1 else torch.tensor(1.0, dtype=torch.float64)
    out = (a - mean) / torch.sqrt(var + eps)
    return (out * batch.step_active()).to(torch.float32)


def turn_gae(batch: StepBatch, *, values: Tensor, episode_next_value: Tensor, episode_truncated: Tensor,
             gamma: float = 0.99, lam: float = 0.9, whiten: bool = True) -> Tensor:
    """Turn-PPO's advantage: turn-level GAE (:func:`turn_gae_returns`), optionally whitened by episode.

    Inactive steps (a branch's re-played turns) take part in the recursion as states but get 0.

    Returns:
        ``[N]`` float32 step advantages.
    """
    adv, _ = turn_gae_returns(batch, values=values, episode_next_value=episode_next_value,
                              episode_truncated=episode_truncated, gamma=gamma, lam=lam)
    if whiten:
        return whiten_by_episode(adv, batch)
    return adv * batch.step_active()


def archer(batch: StepBatch, *, q_values: Tensor, values: Tensor, whiten: bool = False) -> Tensor:
    """ArCHer's actor advantage: ``Q(s_h, a_h) - V(s_h)`` of each turn from the online critic.

    Args:
        batch: The steps.
        q_values: ``[N]`` ``min(Q1, Q2)`` of each step's state and the action taken.
        values: ``[N]`` ``V`` of each step's state.
        whiten: Standardise over the batch, every episode weighing the same.

    Returns:
        ``[N]`` float32 step advantages.
    """
    adv = q_values.to(torch.float32) - values.to(torch.float32)
    return whiten_by_episode(adv, batch) if whiten else adv * batch.step_active()
