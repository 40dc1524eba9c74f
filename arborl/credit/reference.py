"""Slow loop versions of the :class:`StepBatch` estimators, one per estimator, for tests and ``bench/credit.py``.

Each reads the batch as plain Python lists and builds its answer from the per-group reference
loops of :mod:`arborl.credit.advantages`, so no vectorised code is shared with the function it
checks.
"""

from __future__ import annotations

from arborl.credit.advantages import (
    best_return_weights_reference,
    grpo_advantages_reference,
    rloo_advantages_reference,
    step_group_advantages_reference,
)
from arborl.credit.estimators import StepBatch
from arborl.credit.process import NOISE_STD


def _flags(mask, size: int) -> list[bool]:
    return [True] * size if mask is None else mask.tolist()


def _episode_reference(batch: StepBatch, *, baseline: str, norm_by_std: bool, eps: float, singleton: str) -> list[float]:
    """Per-episode advantages over the sampled episodes (0 for the others)."""
    score, group = batch.score.tolist(), batch.group.tolist()
    idx = [e for e, ok in enumerate(_flags(batch.sampled, len(score))) if ok]
    scores, groups = [score[e] for e in idx], [group[e] for e in idx]
    if baseline == "loo":
        vals = rloo_advantages_reference(scores, groups, singleton=singleton)
    else:
        vals = grpo_advantages_reference(scores, groups, norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    out = [0.0] * len(score)
    for e, v in zip(idx, vals, strict=True):
        out[e] = v
    return out


def _length_weights_reference(batch: StepBatch) -> list[float]:
    """Per-step ``mean_turns / turns_of_its_episode`` (active steps; mean over sampled episodes)."""
    n_ep = batch.group.numel()
    active, episode = _flags(batch.active, batch.episode.numel()), batch.episode.tolist()
    turns = [0] * n_ep
    for e, a in zip(episode, active, strict=True):
        turns[e] += a
    base = [t for t, s in zip(turns, _flags(batch.sampled, n_ep), strict=True) if t > 0 and s]
    mean = sum(base) / len(base) if base else 1.0
    return [mean / max(turns[e], 1) for e in episode]


def _returns_reference(batch: StepBatch, gamma: float, values: list[float] | None = None) -> list[float]:
    """Discounted sum-to-go of ``values`` (default: the rewards) of every step within its episode."""
    episode, step = batch.episode.tolist(), batch.step.tolist()
    reward = batch.reward.tolist() if values is None else values
    rows: dict[int, list[int]] = {}
    for i, e in enumerate(episode):
        rows.setdefault(e, []).append(i)
    out = [0.0] * len(episode)
    for idx in rows.values():
        acc = 0.0
        for i in sorted(idx, key=lambda i: step[i], reverse=True):
            acc = reward[i] + gamma * acc
            out[i] = acc
    return out


def _state_keys(batch: StepBatch) -> list[tuple]:
    """(episode group, anchor) of each active step; a key of its own for each inactive one."""
    group, episode, anchor = batch.group.tolist(), batch.episode.tolist(), batch.anchor.tolist()
    active = _flags(batch.active, len(episode))
    return [(group[e], a) if ok else ("inactive", i) for i, (e, a, ok) in enumerate(zip(episode, anchor, active, strict=True))]


def _broadcast_reference(batch: StepBatch, ep_adv: list[float], length_neutral: bool) -> list[float]:
    active = _flags(batch.active, batch.episode.numel())
    weights = _length_weights_reference(batch) if length_neutral else [1.0] * len(active)
    return [ep_adv[e] * a * w for e, a, w in zip(batch.episode.tolist(), active, weights, strict=True)]


def grpo_reference(batch: StepBatch, *, norm_by_std: bool = True, eps: float = 1e-6, length_neutral: bool = False,
                   singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`arborl.credit.grpo`."""
    ep = _episode_reference(batch, baseline="mean", norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    return _broadcast_reference(batch, ep, length_neutral)


def rloo_reference(batch: StepBatch, *, length_neutral: bool = False, singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`arborl.credit.rloo`."""
    ep = _episode_reference(batch, baseline="loo", norm_by_std=False, eps=0.0, singleton=singleton)
    return _broadcast_reference(batch, ep, length_neutral)


def dr_grpo_reference(batch: StepBatch, *, singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`arborl.credit.dr_grpo`."""
    return grpo_reference(batch, norm_by_std=False, length_neutral=False, singleton=singleton)


def _anchor_reference(batch: StepBatch, *, gamma: float, norm_by_std: bool, eps: float) -> list[float]:
    """GiGPO's step term: each active step's discounted return against its (group, anchor) peers."""
    return step_group_advantages_reference(_returns_reference(batch, gamma), _state_keys(batch),
                                           norm_by_std=norm_by_std, eps=eps)


def gigpo_reference(batch: StepBatch, *, gamma: float = 0.95, step_weight: float = 1.0, norm_by_std: bool = True,
                    eps: float = 1e-6, length_neutral: bool = False, singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`arborl.credit.gigpo`."""
    ep = _episode_reference(batch, baseline="mean", norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    a_step = _anchor_reference(batch, gamma=gamma, norm_by_std=norm_by_std, eps=eps)
    combined = [ep[e] + step_weight * s for e, s in zip(batch.episode.tolist(), a_step, strict=True)]
    active = _flags(batch.active, len(combined))
    weights = _length_weights_reference(batch) if length_neutral else [1.0] * len(combined)
    return [c * a * w for c, a, w in zip(combined, active, weights, strict=True)]


def best_step_reference(batch: StepBatch, *, gamma: float = 0.95, tol: float = 1e-6) -> list[float]:
    """Slow loop version of :func:`arborl.credit.best_step`."""
    weights = best_return_weights_reference(_returns_reference(batch, gamma), _state_keys(batch), tol=tol)
    return [w * a for w, a in zip(weights, _flags(batch.active, len(weights)), strict=True)]


def _whiten_by_episode_reference(adv: list[float], batch: StepBatch, eps: float) -> list[float]:
    """Standardise ``adv`` with every episode weighing the same (each of its active turns ``1 / turns``)."""
    episode, active = batch.episode.tolist(), _flags(batch.active, batch.episode.numel())
    turns: dict[int, int] = {}
    for e, a in zip(episode, active, strict=True):
        turns[e] = turns.get(e, 0) + a
    weights = [a / turns[e] if a else 0.0 for e, a in zip(episode, active, strict=True)]
    total = sum(weights)
    if total <= 0:
        return [0.0] * len(adv)
    mean = sum(w * x for w, x in zip(weights, adv, strict=True)) / total
    n_eps = sum(1 for n in turns.values() if n > 0)
    var = sum(w * (x - mean) ** 2 for w, x in zip(weights, adv, strict=True)) / (n_eps - 1) if n_eps > 1 else 1.0
    return [(x - mean) / (var + eps) ** 0.5 * a for x, a in zip(adv, active, strict=True)]


def turn_gae_reference(batch: StepBatch, *, values, episode_next_value, episode_truncated, gamma: float = 0.99,
                       lam: float = 0.9, whiten: bool = True, eps: float = 1e-8) -> list[float]:
    """Slow loop version of :func:`arborl.credit.turn_gae`: the GAE recursion, turn by turn, per episode."""
    episode, step, reward = batch.episode.tolist(), batch.step.tolist(), batch.reward.tolist()
    v, nv, trunc = values.tolist(), episode_next_value.tolist(), episode_truncated.tolist()
    rows: dict[int, list[int]] = {}
    for i, e in enumerate(episode):
        rows.setdefault(e, []).append(i)
    adv = [0.0] * len(episode)
    for e, idx in rows.items():
        nxt, acc = (nv[e] if trunc[e] else 0.0), 0.0
        for i in sorted(idx, key=lambda i: step[i], reverse=True):
            acc = reward[i] + gamma * nxt - v[i] + gamma * lam * acc
            adv[i], nxt = acc, v[i]
    if whiten:
        return _whiten_by_episode_reference(adv, batch, eps)
    return [a * ok for a, ok in zip(adv, _flags(batch.active, len(adv)), strict=True)]


def archer_reference(batch: StepBatch, *, q_values, values, whiten: bool = False, eps: float = 1e-8) -> list[float]:
    """Slow loop version of :func:`arborl.credit.archer`."""
    adv = [q - v for q, v in zip(q_values.tolist(), values.tolist(), strict=True)]
    if whiten:
        return _whiten_by_episode_reference(adv, batch, eps)
    return [a * ok for a, ok in zip(adv, _flags(batch.active, len(adv)), strict=True)]


def process_reference(batch: StepBatch, *, step_scores, weight: float = 1.0, gamma: float = 0.0,
                      norm_by_std: bool = True, eps: float = 1e-6, length_neutral: bool = False,
                      singleton: str = "raw", baseline: str = "group",
                      step_norm_by_std: bool | None = None, anchor_weight: float = 0.0,
                      anchor_gamma: float = 0.95) -> list[float]:
    """Slow loop version of :func:`arborl.credit.process.process`."""
    ep = _episode_reference(batch, baseline="mean", norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    active = _flags(batch.active, batch.episode.numel())
    episode = batch.episode.tolist()
    raw = step_scores.tolist()
    if baseline == "previous":
        raw = _deltas_reference(batch, raw, active)
    elif baseline == "rloo":
        raw = _centred_reference(batch, raw, active)
    scores = [s if a else 0.0 for s, a in zip(raw, active, strict=True)]
    to_go = _returns_reference(batch, gamma, scores)
    group = batch.group.tolist()
    keys = [(group[e],) if a else ("inactive", i) for i, (e, a) in enumerate(zip(episode, active, strict=True))]
    step_norm = norm_by_std if step_norm_by_std is None else step_norm_by_std
    a_step = step_group_advantages_reference(to_go, keys, norm_by_std=step_norm, eps=eps)
    members: dict[tuple, list[float]] = {}
    for k, g in zip(keys, to_go, strict=True):
        members.setdefault(k, []).append(g)
    flat = set()  # groups without spread beyond float noise get no step term
    for k, vals in members.items():
        mean = sum(vals) / len(vals)
        if len(vals) < 2 or (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 <= NOISE_STD:
            flat.add(k)
    a_step = [0.0 if k in flat else a for k, a in zip(keys, a_step, strict=True)]
    combined = [ep[e] + weight * s for e, s in zip(episode, a_step, strict=True)]
    if anchor_weight:
        anchor = _anchor_reference(batch, gamma=anchor_gamma, norm_by_std=norm_by_std, eps=eps)
        combined = [c + anchor_weight * s for c, s in zip(combined, anchor, strict=True)]
    weights = _length_weights_reference(batch) if length_neutral else [1.0] * len(combined)
    return [c * a * w for c, a, w in zip(combined, active, weights, strict=True)]


def _centred_reference(batch: StepBatch, scores: list[float], active: list[bool]) -> list[float]:
    """Each score minus the mean, over its group's other episodes with an active step, of their mean active score."""
    episode, group = batch.episode.tolist(), batch.group.tolist()
    own: dict[int, list[float]] = {}
    for i, e in enumerate(episode):
        if active[i]:
            own.setdefault(e, []).append(scores[i])
    means = {e: sum(v) / len(v) for e, v in own.items()}
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for e, m in means.items():
        total[group[e]] = total.get(group[e], 0.0) + m
        count[group[e]] = count.get(group[e], 0) + 1
    out = []
    for i, e in enumerate(episode):
        g = group[e]  # the other episodes' means: the group's, less this episode's own if it has one
        peer_sum = total.get(g, 0.0) - means.get(e, 0.0)
        peers = count.get(g, 0) - (e in means)
        if peers:
            out.append(scores[i] - peer_sum / peers)
        else:
            out.append(scores[i] - means.get(e, 0.0))
    return out


def _deltas_reference(batch: StepBatch, scores: list[float], active: list[bool]) -> list[float]:
    """Each score minus its episode's previous step's score (a first step: minus its group's mean first score)."""
    episode, step, group = batch.episode.tolist(), batch.step.tolist(), batch.group.tolist()
    at = {(e, k): i for i, (e, k) in enumerate(zip(episode, step, strict=True))}
    firsts: dict[int, list[float]] = {}
    for i, (e, k) in enumerate(zip(episode, step, strict=True)):
        if k == 0 and active[i]:
            firsts.setdefault(group[e], []).append(scores[i])
    out = []
    for i, (e, k) in enumerate(zip(episode, step, strict=True)):
        if k > 0:
            out.append(scores[i] - scores[at[(e, k - 1)]])
        else:
            vals = firsts.get(group[e], [])
            out.append(scores[i] - (sum(vals) / len(vals) if vals else 0.0))
    return out
