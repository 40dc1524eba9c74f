"""Credit estimators over one shared input (:class:`StepBatch`), each returning ``[N]`` step advantages.

* :func:`grpo` — trajectory-level GRPO ("M-GRPO"): one group-relative advantage per episode,
  given to every step of it.
* :func:`gigpo` — GiGPO (Feng et al. 2025): episode advantage plus ``w`` times a step advantage
  computed within anchor-state groups (same group, same environment state) on discounted
  returns, Eq. 8: ``A = A^E + w * A^S``.

``length_neutral=True`` scales each step's advantage by ``mean_turns / turns_of_its_episode``, so
every episode carries the same total weight in a token-mean loss whatever its length. Without it a
turn-invariant token (the end-of-turn token, a format word) receives a net gradient proportional
to ``sum_i A_i * T_i``, which is not zero when failing episodes are longer than successful ones,
and erodes the output format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arborl.credit.advantages import (
    dense_ids,
    discounted_returns,
    grpo_advantages,
    step_group_advantages,
)


@dataclass
class StepBatch:
    """Tensors describing a batch of episodes as flat steps.

    Attributes:
        episode: ``[N]`` long, episode id (0..E-1) of each step.
        step: ``[N]`` long, index of the step within its episode.
        reward: ``[N]`` float, step reward (env reward plus penalties).
        anchor: ``[N]`` long, integer code of the state the step acted from.
        group: ``[E]`` long, GRPO group id of each episode.
        score: ``[E]`` float, the episode's outcome score used by GRPO.
    """

    episode: Tensor
    step: Tensor
    reward: Tensor
    anchor: Tensor
    group: Tensor
    score: Tensor

    def __post_init__(self) -> None:
        n, e = self.episode.numel(), self.group.numel()
        for name in ("step", "reward", "anchor"):
            if getattr(self, name).numel() != n:
                raise ValueError(f"StepBatch.{name} has {getattr(self, name).numel()} entries, expected {n}")
        if self.score.numel() != e:
            raise ValueError(f"StepBatch.score has {self.score.numel()} entries, expected {e} (one per episode)")
        if n and int(self.episode.max()) >= e:
            raise ValueError("StepBatch.episode refers to an episode id >= len(group)")

    def turns_per_episode(self) -> Tensor:
        return torch.bincount(self.episode, minlength=self.group.numel()).to(torch.float32)


def _length_weights(batch: StepBatch) -> Tensor:
    turns = batch.turns_per_episode()
    mean = turns[turns > 0].mean() if (turns > 0).any() else torch.tensor(1.0)
    return (mean / turns.clamp_min(1))[batch.episode]


def grpo(batch: StepBatch, *, norm_by_std: bool = True, eps: float = 1e-6, length_neutral: bool = False) -> Tensor:
    """Trajectory-level GRPO: every step of episode i gets ``A_i``.

    Returns:
        ``[N]`` float32 step advantages.
    """
    adv = grpo_advantages(batch.score, batch.group, norm_by_std=norm_by_std, eps=eps)[batch.episode]
    return adv * _length_weights(batch) if length_neutral else adv


def gigpo(
    batch: StepBatch,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    length_neutral: bool = False,
) -> Tensor:
    """GiGPO: ``A = A^E + w * A^S`` (Eq. 8).

    ``A^E`` is GRPO over episode scores; ``A^S`` normalises the discounted step returns (Eq. 5)
    within groups of steps that share the episode group and the anchor state (Eq. 6-7).

    Returns:
        ``[N]`` float32 step advantages.
    """
    a_ep = grpo_advantages(batch.score, batch.group, norm_by_std=norm_by_std, eps=eps)[batch.episode]
    returns = discounted_returns(batch.reward, batch.episode, batch.step, gamma=gamma)
    step_group = dense_ids(batch.group[batch.episode], batch.anchor)
    a_step = step_group_advantages(returns, step_group, norm_by_std=norm_by_std, eps=eps)
    adv = a_ep + step_weight * a_step
    return adv * _length_weights(batch) if length_neutral else adv
