"""Branch rollouts: try every action at the states a group of episodes visited.

Group sampling compares actions at a state only when group members happen to disagree there;
once the policy is confident they rarely do, and step-level credit (GiGPO's anchor-state groups)
goes silent exactly where the policy is confidently wrong. A *branch* restores the comparison:
it continues a trunk episode from its turn ``k`` (the trunk's first ``k`` turns are its own
first turns, shared; the env re-plays their actions from the same seed to reach the same
state), forces one action the group has not tried at that state, and lets the policy continue
from there. Its return from turn ``k`` on is a Monte-Carlo estimate of ``Q(s, a)`` under the
current policy, so the anchor-state group of ``s`` then holds every action of a finite action
set (the idea behind VinePPO's Monte-Carlo values, Kazemnejad et al. 2024, applied per action).

A branch records where it comes from in ``Episode.origin``: ``Origin(of=trunk id, turn=k,
kind="branch", action=a, state_key=key)``. :func:`branch_diverged` tells when a re-play did not
reach the recorded state (an env that is not reproducible from its seed and actions); such a
continuation carries no credit. Tree continuations (:mod:`arborl.rollout.tree`) are built by the
same :func:`continuation_spec`, with ``kind="tree"`` and no forced action.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arborl.rollout.config import EpisodeSpec
from arborl.trajectory.canonical import content_hash
from arborl.trajectory.schema import Episode, Origin, OriginKind


def continuation_spec(trunk: Episode, k: int, kind: OriginKind, action: str | None = None) -> EpisodeSpec:
    """A spec that continues ``trunk`` from path index ``k``: its first ``k`` turns shared, then the policy.

    Args:
        trunk: The episode continued (it needs a seed: the env re-plays its actions from it).
        k: Path index of the continuation's first own turn.
        kind: ``"branch"`` (``action`` is forced at turn ``k``) or ``"tree"`` (turn ``k`` is re-sampled).
        action: The forced action text of a branch.
    """
    path = trunk.path()
    return EpisodeSpec(
        task_id=trunk.task_id,
        task_type=trunk.task_type,
        group_id=trunk.group_id or trunk.episode_id,
        seed=trunk.seed,  # type: ignore[arg-type]
        options=trunk.metadata.get("options"),
        prefix=tuple(path[:k]),
        origin=Origin(of=trunk.episode_id, turn=k, kind=kind, action=action, state_key=path[k].state_key),
        branch_action=action,
    )


def trunks_to_continue(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes that continuations may start from, in order.

    A trunk is a policy sample (no origin) that the env can re-play from its seed (it has one
    and did not end on an env error), and not a copy of an earlier trunk: the store keeps only
    the first of equal contents, so a continuation of a copy would name a trunk that is not
    stored.
    """
    seen: set[str] = set()
    out = []
    for ep in episodes:
        if ep.origin is None and ep.stop_reason != "env_error" and ep.seed is not None:
            h = content_hash(ep)
            if h not in seen:
                seen.add(h)
                out.append(ep)
    return out


def branch_specs(trunks: Sequence[Episode], actions: Sequence[str], *, max_states: int = 0,
                 generator: torch.Generator | None = None) -> list[EpisodeSpec]:
    """One branch per (group, visited state, action no group member took there).

    Args:
        trunks: Episodes sampled from the policy (their ``group_id`` groups them).
        actions: The env's finite action set, as the texts the env parses (``env.actions``).
        max_states: Branch at most this many of each group's visited states (0: all of them),
            picked uniformly at random from ``generator``: on an env whose failing episodes run to
            the turn limit (Sokoban), every state of every path costs ``|actions| - 1`` branches of
            about an episode each, which a budget of env steps cannot pay for many iterations.
        generator: Random source of the pick (needed when ``max_states`` is set).

    Returns:
        Specs that continue the shallowest visit of each (picked) state and force the untried
        actions, groups and states in first-visit order. States without a state key, and episodes
        that are not trunks (:func:`trunks_to_continue`), are not branched.
    """
    if not actions:
        raise ValueError("branch_specs needs the env's action set; the env exposes none (set env.actions)")
    if max_states < 0:
        raise ValueError(f"max_states is {max_states}; use 0 (every visited state) or a positive count")
    if max_states and generator is None:
        raise ValueError("branch_specs(max_states=...) picks states at random; pass a torch.Generator")
    tried: dict[tuple[str, str], set[str]] = {}
    first: dict[tuple[str, str], tuple[Episode, int]] = {}
    for ep in trunks_to_continue(trunks):
        for k, turn in enumerate(ep.path()):
            if turn.state_key is None:
                continue
            key = (ep.group_id or ep.episode_id, turn.state_key)
            tried.setdefault(key, set())
            if turn.action is not None:
                tried[key].add(turn.action)
            if key not in first or k < first[key][1]:
                first[key] = (ep, k)
    keys = list(first)
    if max_states:
        by_group: dict[str, list[tuple[str, str]]] = {}
        for key in keys:
            by_group.setdefault(key[0], []).append(key)
        picked = set()
        for group_keys in by_group.values():
            order = torch.randperm(len(group_keys), generator=generator)[:max_states].tolist()
            picked.update(group_keys[i] for i in order)
        keys = [key for key in keys if key in picked]
    return [continuation_spec(first[key][0], first[key][1], "branch", action)
            for key in keys for action in actions if action not in tried[key]]


def credited_turns(ep: Episode) -> tuple[int, int]:
    """``(first, stop)``: the turns of ``ep``'s path that carry credit and are trained on.

    A policy sample: all of them. A branch: only its forced action (``origin.turn``); the prefix
    before it is the trunk's, and the continuation after it only measures the action's return. A
    tree continuation: its own turns (``origin.turn`` on). A diverged continuation: none.
    """
    n = len(ep.path())
    o = ep.origin
    if o is None:
        return 0, n
    if branch_diverged(ep):
        return 0, 0
    return (o.turn, o.turn + 1) if o.kind == "branch" else (o.turn, n)


def own_turns(ep: Episode) -> int:
    """Turns of ``ep``'s path that are its own: every turn of a policy sample, a continuation's from ``origin.turn`` on.

    A continuation's first ``origin.turn`` turns are its trunk's (the same turns, stored once): the
    env re-plays their actions only to reach the state the continuation starts from, and they hold
    no new experience. A run's ``env_steps`` counts own turns, so each node of a rollout tree is
    one step of the budget, as the tree's turns are counted by Tree-GRPO (Ji et al. 2025); the
    re-played ones are counted apart (``replayed_steps``).
    """
    n = len(ep.path())
    return n if ep.origin is None else max(0, n - ep.origin.turn)


def branch_diverged(ep: Episode) -> bool:
    """True when a continuation's re-play did not reach the state it was meant to continue from."""
    o = ep.origin
    if o is None:
        return False
    path = ep.path()
    return len(path) <= o.turn or path[o.turn].state_key != o.state_key
