"""Tree rollouts: re-sample continuations from turns of a group's episodes, for any reproducible env.

Branch rollouts (:mod:`arborl.rollout.branch`) need a finite action set to try every action at a
state. A tree rollout needs none (free text, tool calls, code): it picks turns of the group's
trajectories and re-samples ``k`` continuations from the prefix before each (the same seed, the
trunk's turns re-played in the env, the policy sampling the picked turn afresh). The group then
forms a tree: every picked turn is a node with ``k + 1`` subtrees (the trunk's own and the
continuations), whose mean returns give each node a value and each turn an advantage
(:mod:`arborl.credit.tree`), the idea of Tree-GRPO (Ji et al. 2025) and TreeRL, where states
never repeat exactly and anchor-state groups (GiGPO) stay empty.

Which turns: ``uniform`` picks ``nodes`` turns of the group uniformly at random (without
replacement); ``entropy`` picks the turns where the policy was least sure, scored by the mean
negative log-prob of the turn's sampled tokens: for tokens drawn from the policy that is an
unbiased estimate of its per-token entropy there, and it needs no extra forward pass.

The continuations share the trunk's prefix turns (``Episode.origin`` of kind ``"tree"``; the
store keeps them once) and, given the trunk run's :class:`~arborl.rollout.kvcache.PrefixCache`,
start from the trunk's kept KV cache: only the trunk's unfed tail (the last token of the turn
before the picked one) and the picked turn's prompt are prefilled. A continuation of turn 0 has
no shared tokens to take (its prompt is the start prompt), so it prefills that prompt as a fresh
episode would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch

from arborl.rollout.branch import continuation_spec, trunks_to_continue
from arborl.rollout.config import EpisodeSpec
from arborl.trajectory.schema import Episode, Turn

TreeSelect = Literal["uniform", "entropy"]
TREE_SELECTS: tuple[str, ...] = get_args(TreeSelect)


def turn_entropy(turn: Turn) -> float:
    """Mean of ``-log p`` over the turn's trained output tokens (0 without any): an estimate of the policy's entropy."""
    lps = [-lp for lp, m in zip(turn.output_logprobs, turn.output_mask, strict=True) if m]
    return sum(lps) / len(lps) if lps else 0.0


def tree_specs(trunks: Sequence[Episode], *, k: int, nodes: int, select: TreeSelect,
               generator: torch.Generator) -> list[EpisodeSpec]:
    """``k`` continuations from each of ``nodes`` turns per group of ``trunks``.

    Args:
        trunks: Episodes sampled from the policy; their ``group_id`` groups them. Only
            :func:`~arborl.rollout.branch.trunks_to_continue` of them are expanded.
        k: Continuations per picked turn.
        nodes: Turns picked per group (fewer if the group has fewer turns).
        select: ``"uniform"`` or ``"entropy"`` (see the module docstring).
        generator: Random source of the uniform pick.

    Returns:
        Specs of kind ``"tree"``, group by group, in pick order.

    Raises:
        ValueError: ``k`` or ``nodes`` below 1, or an unknown ``select``.
    """
    if k < 1 or nodes < 1:
        raise ValueError(f"tree rollouts need k >= 1 and nodes >= 1 (got k={k}, nodes={nodes})")
    if select not in TREE_SELECTS:
        raise ValueError(f"tree select {select!r} is unknown; choose one of {list(TREE_SELECTS)}")
    groups: dict[str, list[tuple[Episode, int]]] = {}
    for ep in trunks_to_continue(trunks):
        groups.setdefault(ep.group_id or ep.episode_id, []).extend((ep, t) for t in range(len(ep.path())))
    specs = []
    for cands in groups.values():
        if select == "uniform":
            picked = [cands[i] for i in torch.randperm(len(cands), generator=generator)[:nodes].tolist()]
        else:
            score = [turn_entropy(ep.path()[t]) for ep, t in cands]
            order = sorted(range(len(cands)), key=lambda i: -score[i])  # stable: ties in trajectory order
            picked = [cands[i] for i in order[:nodes]]
        specs += [continuation_spec(ep, t, "tree") for ep, t in picked for _ in range(k)]
    return specs
