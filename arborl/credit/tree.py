"""Tree credit: node values from the mean return of the leaves below, advantages from value differences.

A group's episodes form a forest when continuations share their trunks' prefix turns (tree
rollouts, branches): each turn is a node, each episode a leaf at the end of its path
(:attr:`StepBatch.node`, :attr:`StepBatch.parent`). The value of a node is the mean outcome
score of the episodes whose paths pass through it, ``V(n) = mean{R_e : n on path(e)}``, and the
group's start state is a virtual root with the mean score of all its leaves. A turn ``n`` with
parent ``p`` gets the step advantage ``A^T = V(n) - V(p)``: how much choosing this turn raised
the expected outcome over the state before it, estimated by the subtrees actually sampled there
(Tree-GRPO, Ji et al. 2025; TreeRL). The episode-level GRPO term is added with a weight,
``A = A^T + w * A^E``, as GiGPO adds its episode term.

Only active steps get credit (a shared prefix is credited once, in its trunk's row), and an
episode without any active step (a continuation whose re-play diverged) is no leaf: its score
counts towards no node. Leaf returns are episode scores (the outcome), not discounted step
returns, so the estimator needs no ``gamma``. Nothing here imports env, rollout or policy code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arborl.credit.estimators import StepBatch, _episode_advantages, _length_weights


def _tree(batch: StepBatch) -> tuple[Tensor, Tensor]:
    if batch.node is None or batch.parent is None:
        raise ValueError("tree credit needs StepBatch.node and StepBatch.parent (the rollout tree); build the batch "
                         "with arborl.train.batch.step_batch, or choose another rl.credit")
    return batch.node, batch.parent


def tree_values(batch: StepBatch) -> tuple[Tensor, Tensor]:
    """``([M] node values, [G] root values)``: mean score of the leaf episodes below each node / in each group."""
    node, parent = _tree(batch)
    active = batch.step_active().to(torch.float32)
    n_ep, n_nodes = batch.group.numel(), parent.numel()
    leaf = (torch.bincount(batch.episode, weights=active, minlength=n_ep) > 0).to(torch.float32)  # [E]
    w = leaf[batch.episode]
    s = batch.score.to(torch.float32)
    num = torch.bincount(node, weights=s[batch.episode] * w, minlength=n_nodes)
    den = torch.bincount(node, weights=w, minlength=n_nodes)
    n_groups = int(batch.group.max()) + 1 if n_ep else 0
    g_num = torch.bincount(batch.group, weights=s * leaf, minlength=n_groups)
    g_den = torch.bincount(batch.group, weights=leaf, minlength=n_groups)
    return num / den.clamp_min(1), g_num / g_den.clamp_min(1)


def tree_advantages(batch: StepBatch) -> Tensor:
    """``[N]`` float32: ``V(node) - V(parent)`` of each active step (the root value for a root turn), 0 elsewhere."""
    node, parent = _tree(batch)
    values, roots = tree_values(batch)
    up = parent[node]
    before = torch.where(up >= 0, values[up.clamp_min(0)], roots[batch.group[batch.episode]])
    return (values[node] - before) * batch.step_active()


def tree(batch: StepBatch, *, episode_weight: float = 1.0, norm_by_std: bool = True, eps: float = 1e-6,
         length_neutral: bool = False, singleton: str = "raw") -> Tensor:
    """Tree credit: ``A = A^T + episode_weight * A^E`` for every active step.

    Args:
        batch: The steps, with the rollout tree (``node``, ``parent``).
        episode_weight: Weight of the episode-level GRPO term (0: tree advantages alone).
        norm_by_std: Divide the GRPO term by its group's std (the tree term is never divided).
        eps: Added to the std.
        length_neutral: Scale each step by ``mean_turns / turns_of_its_episode``.
        singleton: GRPO's rule for an episode without peers (``raw`` or ``zero``).

    Returns:
        ``[N]`` float32 step advantages.

    Raises:
        ValueError: the batch has no tree structure.
    """
    a_ep = _episode_advantages(batch, norm_by_std=norm_by_std, eps=eps, singleton=singleton)[batch.episode]
    adv = tree_advantages(batch) + episode_weight * a_ep * batch.step_active()
    return adv * _length_weights(batch) if length_neutral else adv


def tree_reference(batch: StepBatch, *, episode_weight: float = 1.0, norm_by_std: bool = True, eps: float = 1e-6,
                   length_neutral: bool = False, singleton: str = "raw") -> list[float]:
    """Slow loop version of :func:`tree`: walks each leaf's path and averages per node by hand."""
    from arborl.credit.reference import _episode_reference, _length_weights_reference

    _tree(batch)
    episode, group, node = batch.episode.tolist(), batch.group.tolist(), batch.node.tolist()  # type: ignore[union-attr]
    parent, score = batch.parent.tolist(), batch.score.tolist()  # type: ignore[union-attr]
    active = [True] * len(episode) if batch.active is None else batch.active.tolist()
    leaves = {e for e, a in zip(episode, active, strict=True) if a}
    below: dict[int, list[float]] = {}
    in_group: dict[int, list[float]] = {}
    for e, n in zip(episode, node, strict=True):
        if e in leaves:
            below.setdefault(n, []).append(score[e])
    for e in sorted(leaves):
        in_group.setdefault(group[e], []).append(score[e])

    def value(n: int, e: int) -> float:
        vals = below.get(n) if n >= 0 else in_group.get(group[e])
        return sum(vals) / len(vals) if vals else 0.0

    ep = _episode_reference(batch, baseline="mean", norm_by_std=norm_by_std, eps=eps, singleton=singleton)
    weights = _length_weights_reference(batch) if length_neutral else [1.0] * len(episode)
    return [((value(n, e) - value(parent[n], e)) + episode_weight * ep[e]) * a * w if a else 0.0
            for e, n, a, w in zip(episode, node, active, weights, strict=True)]
