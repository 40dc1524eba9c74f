"""Credit estimators over one shared input (:class:`StepBatch`), each returning ``[N]`` step advantages.

* :func:`grpo` — trajectory-level GRPO ("M-GRPO"): one group-relative advantage per episode,
  given to every step of it.
* :func:`rloo` — the same with a leave-one-out baseline (RLOO): ``R_i - mean_{j != i} R_j``.
* :func:`dr_grpo` — Dr.GRPO (Liu et al. 2025): ``R_i - mean(R)``, neither divided by the group
  std nor scaled by episode length.
* :func:`gigpo` — GiGPO (Feng et al. 2025): episode advantage plus ``w`` times a step advantage
  computed within anchor-state groups (same group, same environment state) on discounted
  returns, Eq. 8: ``A = A^E + w * A^S``.

* :func:`best_step` — Monte-Carlo policy iteration over anchor-state groups: the steps whose
  discounted return is the best of their state group are reinforced, nothing else. With branch
  rollouts (every action tried at every visited state) this is a greedy improvement step on
  ``Q^pi(s, .)`` estimated by the policy's own continuations.

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
    best_return_weights,
    dense_ids,
    discounted_returns,
    grpo_advantages,
    rloo_advantages,
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
        active: ``[N]`` bool or None (all active): steps that get credit. An inactive step (a
            branch's re-play of its trunk's turns) gets advantage 0, joins no step group and does
            not count towards its episode's length.
        sampled: ``[E]`` bool or None (all sampled): episodes drawn from the policy at the group's
            start state. Only these enter the episode-level (GRPO) statistics; the others (branches,
            which start with a forced action) get episode advantage 0.
        node: ``[N]`` long or None: the rollout-tree node (0..M-1) of each step; a turn that several
            episodes share (a continuation's prefix) is one node (:mod:`arborl.credit.tree`).
        parent: ``[M]`` long or None: the parent node of each node, -1 for a root.
    """

    episode: Tensor
    step: Tensor
    reward: Tensor
    anchor: Tensor
    group: Tensor
    score: Tensor
    active: Tensor | None = None
    sampled: Tensor | None = None
    node: Tensor | None = None
    parent: Tensor | None = None

    def __post_init__(self) -> None:
        n, e = self.episode.numel(), self.group.numel()
        for name in ("step", "reward", "anchor"):
            if getattr(self, name).numel() != n:
                raise ValueError(f"StepBatch.{name} has {getattr(self, name).numel()} entries, expected {n}")
        if self.score.numel() != e:
            raise ValueError(f"StepBatch.score has {self.score.numel()} entries, expected {e} (one per episode)")
        if n and int(self.episode.max()) >= e:
            raise ValueError("StepBatch.episode refers to an episode id >= len(group)")
        for name, size in (("active", n), ("sampled", e)):
            value = getattr(self, name)
            if value is not None and (value.dtype != torch.bool or value.numel() != size):
                raise ValueError(f"StepBatch.{name} must be a bool tensor of {size} entries (or None)")
        if (self.node is None) != (self.parent is None) or (self.node is not None and self.node.numel() != n):
            raise ValueError(f"StepBatch.node ({n} entries) and StepBatch.parent come together (or both None)")

    def turns_per_episode(self) -> Tensor:
        """Active steps per episode."""
        w = None if self.active is None else self.active.to(torch.float32)
        return torch.bincount(self.episode, weights=w, minlength=self.group.numel()).to(torch.float32)

    def step_active(self) -> Tensor:
        """``[N]`` bool: steps that take part in credit (all of them when ``active`` is None)."""
        return torch.ones_like(self.episode, dtype=torch.bool) if self.active is None else self.active

    def select_episodes(self, keep: Tensor) -> tuple[StepBatch, Tensor]:
        """The batch of the episodes where ``keep`` (``[E]`` bool) is true, ids made dense again.

        Returns:
            The sub-batch and ``[N']`` long, the row in this batch of each of its steps.
        """
        rows = keep[self.episode].nonzero()[:, 0]
        kept = keep.nonzero()[:, 0]
        new_id = torch.cumsum(keep.to(torch.long), 0) - 1
        group = dense_ids(self.group[kept]) if kept.numel() else self.group[kept]
        sub = StepBatch(
            episode=new_id[self.episode[rows]], step=self.step[rows], reward=self.reward[rows],
            anchor=self.anchor[rows], group=group, score=self.score[kept],
            active=None if self.active is None else self.active[rows],
            sampled=None if self.sampled is None else self.sampled[kept],
            node=None if self.node is None else self.node[rows], parent=self.parent,
        )
        return sub, rows


def _length_weights(batch: StepBatch) -> Tensor:
    turns = batch.turns_per_episode()
    # the mean length of the policy's samples sets the scale (branches are not samples)
    base = turns[(turns > 0) & (batch.sampled if batch.sampled is not None else True)]
    mean = base.mean() if base.numel() else torch.tensor(1.0)
    return (mean / turns.clamp_min(1))[batch.episode]


def _state_groups(batch: StepBatch) -> Tensor:
    """``[N]`` dense ids of (episode group, anchor state).

    Each inactive step is a singleton group, so it shifts no one's baseline and gets no step
    advantage itself.
    """
    active = batch.step_active()
    anchor = torch.where(active, batch.anchor, -1 - torch.arange(active.numel()))
    return dense_ids(batch.group[batch.episode], anchor)


def _episode_advantages(batch: StepBatch, *, baseline: str = "mean", norm_by_std: bool = True, eps: float = 1e-6,
                        singleton: str = "raw") -> Tensor:
    """``[E]`` group-relative advantages over the sampled episodes; 0 for the others.

    ``baseline`` is ``mean`` (GRPO; divided by the group std when ``norm_by_std``) or ``loo``
    (RLOO's leave-one-out mean).
    """
    if baseline == "loo":
        def fn(score, group):
            return rloo_advantages(score, group, singleton=singleton)
    else:
        def fn(score, group):
            return grpo_advantages(score, group, norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    if batch.sampled is None:
        return fn(batch.score, batch.group)
    out = torch.zeros_like(batch.score, dtype=torch.float32)
    idx = batch.sampled.nonzero()[:, 0]
    if idx.numel():
        out[idx] = fn(batch.score[idx], dense_ids(batch.group[idx])).to(torch.float32)
    return out


def _broadcast_episodes(batch: StepBatch, ep_adv: Tensor, length_neutral: bool) -> Tensor:
    """Every active step of episode i gets ``ep_adv[i]`` (scaled by its length weight when asked)."""
    adv = ep_adv[batch.episode] * batch.step_active()
    return adv * _length_weights(batch) if length_neutral else adv


def grpo(batch: StepBatch, *, norm_by_std: bool = True, eps: float = 1e-6, length_neutral: bool = False,
         singleton: str = "raw") -> Tensor:
    """Trajectory-level GRPO: every step of episode i gets ``A_i = (R_i - mean) / (std + eps)``.

    Args:
        batch: The steps.
        norm_by_std: Divide by the group std (False: ``R_i - mean``).
        eps: Added to the std.
        length_neutral: Scale each step by ``mean_turns / turns_of_its_episode``.
        singleton: ``raw`` (a lone episode gets ``A = R``) or ``zero`` (it gets 0).

    Returns:
        ``[N]`` float32 step advantages.
    """
    ep = _episode_advantages(batch, norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    return _broadcast_episodes(batch, ep, length_neutral)


def rloo(batch: StepBatch, *, length_neutral: bool = False, singleton: str = "raw") -> Tensor:
    """Trajectory-level RLOO: every step of episode i gets ``R_i - mean_{j != i} R_j`` (its group's others).

    The baseline does not contain the episode's own score, so it is unbiased; no std division.

    Args:
        batch: The steps.
        length_neutral: Scale each step by ``mean_turns / turns_of_its_episode``.
        singleton: ``raw`` (a lone episode gets ``A = R``) or ``zero`` (it gets 0).

    Returns:
        ``[N]`` float32 step advantages.
    """
    ep = _episode_advantages(batch, baseline="loo", singleton=singleton)
    return _broadcast_episodes(batch, ep, length_neutral)


def dr_grpo(batch: StepBatch, *, singleton: str = "raw") -> Tensor:
    """Dr.GRPO ("GRPO done right", Liu et al. 2025): ``A_i = R_i - mean(R)`` given to every step of episode i.

    Neither of GRPO's two normalisations: no division by the group std (which up-weights groups
    that are nearly all-equal) and no scaling by the episode's length (which favours short
    correct and long wrong answers). The loss side of "no length normalisation" is
    ``rl.loss_agg`` (anything but ``seq-mean-token-mean``; the paper's constant is
    ``seq-mean-token-sum-norm``).

    Returns:
        ``[N]`` float32 step advantages.
    """
    return grpo(batch, norm_by_std=False, length_neutral=False, singleton=singleton)


def anchor_step_advantages(batch: StepBatch, *, gamma: float = 0.95, norm_by_std: bool = True,
                           eps: float = 1e-6) -> Tensor:
    """``[N]`` GiGPO's step term ``A^S``: discounted step returns normalised within anchor-state groups.

    A step group holds the active steps of one episode group that acted from the same anchor state
    (Eq. 6-7); a lone step gets 0.
    """
    returns = discounted_returns(batch.reward, batch.episode, batch.step, gamma=gamma)
    return step_group_advantages(returns, _state_groups(batch), norm_by_std=norm_by_std, eps=eps)


def gigpo(
    batch: StepBatch,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    length_neutral: bool = False,
    singleton: str = "raw",
) -> Tensor:
    """GiGPO: ``A = A^E + w * A^S`` (Eq. 8).

    ``A^E`` is GRPO over episode scores (a lone episode: ``singleton``); ``A^S`` normalises the
    discounted step returns (Eq. 5) within groups of steps that share the episode group and the
    anchor state (Eq. 6-7); a lone step gets ``A^S = 0`` whatever ``singleton`` says.

    Returns:
        ``[N]`` float32 step advantages.
    """
    a_ep = _episode_advantages(batch, norm_by_std=norm_by_std, eps=eps, singleton=singleton)[batch.episode]
    a_step = anchor_step_advantages(batch, gamma=gamma, norm_by_std=norm_by_std, eps=eps)
    adv = (a_ep + step_weight * a_step) * batch.step_active()
    return adv * _length_weights(batch) if length_neutral else adv


def best_step(batch: StepBatch, *, gamma: float = 0.95, tol: float = 1e-6) -> Tensor:
    """Reinforce the best action of every state: approximate policy iteration.

    Each active step's discounted return estimates ``Q(s, a)`` for the action it took. Within a
    step group (same episode group, same anchor state) the steps with the best return share
    advantage 1 and all others get 0 (:func:`~arborl.credit.advantages.best_return_weights`), so
    the update is a cross-entropy step towards the greedy action of the estimated ``Q``:
    its push on an action fades as the policy already prefers it (unlike a normalised
    advantage, which sharpens a confident policy further every iteration), and it never pushes
    an action down, which spreads mass over the whole vocabulary. States whose actions all
    returned the same carry no signal. Group membership and ``sampled`` play no role: a branch's
    forced action competes on its return alone.

    Returns:
        ``[N]`` float32 step advantages in [0, 1]; each informative state group sums to 1.
    """
    returns = discounted_returns(batch.reward, batch.episode, batch.step, gamma=gamma)
    return best_return_weights(returns, _state_groups(batch), tol=tol) * batch.step_active()
