"""Process-reward credit: episode advantages plus a weighted step term from a process reward model.

A process reward model (explicit, AgentPRM-style, or implicit, PRIME / iStar-style; the models
live in :mod:`arborl.prm`) gives every step a score ``p_t``. This module turns those scores into
step advantages and combines them with the group-relative episode advantage:

    G^P_t = sum_{k >= t} gamma^(k - t) p_k          (process return-to-go; gamma = 0: p_t itself)
    A^P_t = (G^P_t - mean_g G^P) / (std_g G^P + eps) (over the active steps of episode group g)
    A_t   = A^E_i + w * A^P_t (+ w_S * A^S_t)        (A^E: GRPO over episode scores, as ``grpo``)

* ``gamma = 0`` is the right choice for an explicit PRM, whose scores already estimate the
  outcome from the step on (a Monte-Carlo ``Q(s_t, a_t)``); summing them to go would count the
  future several times. ``gamma = 1`` is PRIME's: implicit per-turn rewards are increments of
  one sequence-level reward, so the step's advantage is the sum of what follows it.
* The step term is normalised within the episode group (the same task and start state), like
  GiGPO's anchor-state groups but without requiring states to repeat: a step is compared with
  every other step of the group's trajectories. A group with one active step, or whose process
  returns are all equal (a std of at most ``NOISE_STD``), gets ``A^P = 0``; ``norm_by_std = False``
  keeps the raw difference.
* ``baseline = "previous"`` first replaces each score by its difference to the previous step's
  (:func:`score_deltas`): with scores that estimate ``Q(s_t, a_t)``, the previous score estimates
  ``V(s_t)``, so the step term rewards actions that improved the prospects rather than steps that
  happen to sit in good states; ``group`` compares the raw scores across the group.
* ``baseline = "rloo"`` first subtracts from each score the mean per-step score of the group's
  *other* episodes (:func:`score_centred`; PRIME's leave-one-out baseline per reward source). A
  reward model whose scores drift (every step a little positive, or negative, as an implicit
  PRM's log-ratio does while the policy moves away from its reference) otherwise turns the drift
  into a length bias through the return-to-go: with ``gamma > 0`` a step with more steps after it
  collects more of the drift, so the policy is trained towards longer (or shorter) episodes.
  Centred, a constant drift cancels exactly.
* ``anchor_weight = w_S > 0`` adds GiGPO's anchor-state step term ``A^S``
  (:func:`arborl.credit.estimators.anchor_step_advantages`): where states repeat, the steps that
  acted from the same state are also compared by their discounted environment returns, so the
  reward model's estimate and the measured returns both speak.
* Inactive steps (a branch's replay of its trunk) get 0 and are not compared; a replayed step's
  score is still the ``previous`` baseline of the step after it.

Nothing here imports env, rollout, policy or train code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arborl.credit.advantages import _segment_mean_std, dense_ids, discounted_returns, step_group_advantages
from arborl.credit.estimators import StepBatch, _episode_advantages, _length_weights, anchor_step_advantages

NOISE_STD = 1e-5
"""Process returns of a group that spread less than this (std) are float noise, not a signal: an implicit
PRM equal to its reference gives log-ratios of about 1e-7, which the std division would blow up to O(1)."""


def _check_scores(batch: StepBatch, step_scores: Tensor | None) -> Tensor:
    if step_scores is None:
        raise ValueError("the process estimator needs step_scores ([N], one per step row): set rl.credit to a "
                         "process-reward method (prm, implicit_prm, istar) so a reward model provides them")
    if step_scores.numel() != batch.episode.numel():
        raise ValueError(f"step_scores has {step_scores.numel()} entries, expected {batch.episode.numel()} "
                         "(one per step row of the StepBatch)")
    return step_scores.detach().to(torch.float32).reshape(-1)


BASELINES = ("group", "previous", "rloo")
"""What a step's score is compared with: the group's other steps, first the episode's previous step, or first
the mean step score of the group's other episodes."""


def score_deltas(batch: StepBatch, scores: Tensor) -> Tensor:
    """``[N]`` ``p_t - p_{t-1}`` within each episode; a first step: ``p_0`` minus its group's mean first-step score.

    With scores that estimate ``Q(s_t, a_t)``, the previous step's score estimates the value of the
    state the step acted from, so the difference is a temporal-difference advantage; the first
    step is compared with the other first actions from the group's (shared) start state.
    """
    n, e, s = batch.episode.numel(), batch.episode, batch.step
    if not n:
        return scores
    width = int(s.max()) + 1
    row_of = torch.full((batch.group.numel() * width,), -1, dtype=torch.long)
    row_of[e * width + s] = torch.arange(n)
    prev = torch.where(s > 0, row_of[(e * width + s - 1).clamp_min(0)], -1)
    group = batch.group[e]
    first = (s == 0) & batch.step_active()
    n_groups = int(batch.group.max()) + 1
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group[first], scores[first].to(torch.float64))
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group[first], torch.ones_like(total[group[first]]))
    start = (total / count.clamp_min(1)).to(scores.dtype)
    return scores - torch.where(prev >= 0, scores[prev.clamp_min(0)], start[group])


def score_centred(batch: StepBatch, scores: Tensor) -> Tensor:
    """``[N]`` each score minus the mean over its group's other episodes of their mean active-step score.

    PRIME's leave-one-out baseline of a reward source, per step instead of per token: episode ``j``
    of a group has ``m_j``, the mean of its active steps' scores, and a step of episode ``i`` gets
    ``p_t - mean_{j != i} m_j``. An episode whose group has no other episode with an active step is
    centred on its own ``m_i``. Inactive steps neither count in any ``m_j`` nor change anything but
    their own (later zeroed) value.
    """
    n_ep = batch.group.numel()
    if not scores.numel():
        return scores
    active = batch.step_active().to(torch.float64)
    e = batch.episode
    ep_sum = torch.zeros(n_ep, dtype=torch.float64).index_add_(0, e, scores.to(torch.float64) * active)
    ep_cnt = torch.zeros(n_ep, dtype=torch.float64).index_add_(0, e, active)
    has = (ep_cnt > 0).to(torch.float64)
    mean = ep_sum / ep_cnt.clamp_min(1)
    n_groups = int(batch.group.max()) + 1
    g_sum = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, batch.group, mean * has)
    g_cnt = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, batch.group, has)
    others = g_cnt[batch.group] - has
    base = torch.where(others > 0, (g_sum[batch.group] - mean * has) / others.clamp_min(1), mean)
    return (scores.to(torch.float64) - base[e]).to(scores.dtype)


def process_step_advantages(batch: StepBatch, step_scores: Tensor, *, gamma: float = 0.0, norm_by_std: bool = True,
                            eps: float = 1e-6, tol: float = NOISE_STD, baseline: str = "group") -> Tensor:
    """``[N]`` the step term ``A^P``: process returns-to-go normalised within each episode group.

    Args:
        batch: The steps.
        step_scores: ``[N]`` process reward of each step.
        gamma: Discount of the process return-to-go (0: each step's own score).
        norm_by_std: Divide by the group's std of process returns (False: subtract the mean only).
        eps: Added to the std.
        tol: A group whose process returns have a std of at most this has no spread (gets 0).
        baseline: ``group`` (each score as it is), ``previous`` (:func:`score_deltas` first) or ``rloo``
            (:func:`score_centred` first).

    Returns:
        ``[N]`` float32; 0 for inactive steps and for groups without spread.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline = {baseline!r} is unknown; choose one of {list(BASELINES)}")
    active = batch.step_active()
    scores = _check_scores(batch, step_scores)
    if baseline == "previous":
        scores = score_deltas(batch, scores)
    elif baseline == "rloo":
        scores = score_centred(batch, scores)
    scores = scores * active
    returns = discounted_returns(scores, batch.episode, batch.step, gamma=gamma)
    key = torch.where(active, torch.zeros_like(batch.episode), -1 - torch.arange(active.numel()))
    groups = dense_ids(batch.group[batch.episode], key) if active.numel() else batch.episode
    n_seg = int(groups.max()) + 1 if groups.numel() else 0
    spread = _segment_mean_std(returns.to(torch.float64), groups, n_seg)[2][groups] > tol
    return step_group_advantages(returns, groups, norm_by_std=norm_by_std, eps=eps) * active * spread


def process(batch: StepBatch, *, step_scores: Tensor | None = None, weight: float = 1.0, gamma: float = 0.0,
            norm_by_std: bool = True, eps: float = 1e-6, length_neutral: bool = False,
            singleton: str = "raw", baseline: str = "group", step_norm_by_std: bool | None = None,
            anchor_weight: float = 0.0, anchor_gamma: float = 0.95) -> Tensor:
    """Episode advantage plus weighted process-reward step advantage: ``A = A^E + w * A^P (+ w_S * A^S)``.

    Args:
        batch: The steps.
        step_scores: ``[N]`` process reward of each step row (from a reward model's ``step_inputs``).
        weight: ``w``, the weight of the step term (0: plain GRPO).
        gamma: Discount of the process return-to-go (0: each step's own score).
        norm_by_std: Divide both terms by their group std (False: Dr.GRPO-style differences).
        step_norm_by_std: Divide the step term by its group std (None: as ``norm_by_std``). False keeps the
            process returns on their own scale, so a reward model whose scores barely differ contributes
            little instead of being stretched to the outcome term's unit spread.
        eps: Added to the stds.
        length_neutral: Scale each step by ``mean_turns / turns_of_its_episode``.
        singleton: What a lone episode gets at the episode level (``raw``: ``A^E = R``; ``zero``: 0).
        baseline: ``group``, ``previous`` (score differences along the episode; :func:`score_deltas`) or
            ``rloo`` (scores minus the group's other episodes' mean step score; :func:`score_centred`).
        anchor_weight: ``w_S``, the weight of GiGPO's anchor-state step term (0: none).
        anchor_gamma: Discount of the environment returns in that term.

    Returns:
        ``[N]`` float32 step advantages.
    """
    scores = _check_scores(batch, step_scores)
    a_ep = _episode_advantages(batch, norm_by_std=norm_by_std, eps=eps, singleton=singleton)[batch.episode]
    step_norm = norm_by_std if step_norm_by_std is None else step_norm_by_std
    a_step = process_step_advantages(batch, scores, gamma=gamma, norm_by_std=step_norm, eps=eps, baseline=baseline)
    adv = a_ep + weight * a_step
    if anchor_weight:
        adv = adv + anchor_weight * anchor_step_advantages(batch, gamma=anchor_gamma, norm_by_std=norm_by_std, eps=eps)
    adv = adv * batch.step_active()
    return adv * _length_weights(batch) if length_neutral else adv
