"""Branch rollouts: try every action at the states a group of episodes visited.

Group sampling compares actions at a state only when group members happen to disagree there;
once the policy is confident they rarely do, and step-level credit (GiGPO's anchor-state groups)
goes silent exactly where the policy is confidently wrong. A *branch* restores the comparison:
it re-plays a trunk episode's first ``k`` turns (same seed, the trunk's exact output tokens, so
the environment reaches the same state), forces one action the group has not tried at that
state, and lets the policy continue from there. Its return from turn ``k`` on is a Monte-Carlo
estimate of ``Q(s, a)`` under the current policy, so the anchor-state group of ``s`` then holds
every action of a finite action set (the idea behind VinePPO's Monte-Carlo values, Kazemnejad et
al. 2024, applied per action).

A branch records where it comes from in ``Episode.metadata``: ``replayed_turns`` (its first
turns, recorded with loss mask 0) and ``branch = {"of": trunk episode id, "turn": k, "action":
a, "state_key": key}``. :func:`branch_diverged` tells when a re-play did not reach the recorded
state (an env that is not reproducible from its seed and actions); such a branch carries no
credit.
"""

from __future__ import annotations

from collections.abc import Sequence

from arborl.rollout.config import EpisodeSpec
from arborl.trajectory.schema import Episode


def branch_specs(trunks: Sequence[Episode], actions: Sequence[str]) -> list[EpisodeSpec]:
    """One branch per (group, visited state, action no group member took there).

    Args:
        trunks: Episodes sampled from the policy (their ``group_id`` groups them).
        actions: The env's finite action set, as the texts the env parses (``env.actions``).

    Returns:
        Specs that re-play the shallowest visit of each state and force the untried action.
        States without a state key, and episodes without a seed or ended on an env error, are not
        branched.
    """
    if not actions:
        raise ValueError("branch_specs needs the env's action set; the env exposes none (set env.actions)")
    tried: dict[tuple[str, str], set[str]] = {}
    first: dict[tuple[str, str], tuple[Episode, int]] = {}
    for ep in trunks:
        if ep.stop_reason == "env_error" or ep.seed is None:  # no seed: the state cannot be re-played
            continue
        for k, turn in enumerate(ep.path()):
            if turn.state_key is None:
                continue
            key = (ep.group_id or ep.episode_id, turn.state_key)
            tried.setdefault(key, set())
            if turn.action is not None:
                tried[key].add(turn.action)
            if key not in first or k < first[key][1]:
                first[key] = (ep, k)
    specs = []
    for key, (ep, k) in first.items():
        path = ep.path()
        replay = tuple(tuple(t.output_ids) for t in path[:k])
        for action in actions:
            if action in tried[key]:
                continue
            specs.append(EpisodeSpec(
                task_id=ep.task_id,
                task_type=ep.task_type,
                group_id=ep.group_id or ep.episode_id,
                seed=ep.seed,
                options=ep.metadata.get("options"),
                replay=replay,
                branch_action=action,
                metadata={"branch": {"of": ep.episode_id, "turn": k, "action": action, "state_key": key[1]}},
            ))
    return specs


def credited_turns(ep: Episode) -> tuple[int, int]:
    """``(first, stop)``: the turns of ``ep``'s path that carry credit and are trained on.

    A policy sample: all of them. A branch: only its forced action (``turn``); the re-play before it
    is the trunk's, and the continuation after it only measures the action's return. A diverged
    branch: none.
    """
    n = len(ep.path())
    info = ep.metadata.get("branch")
    if not info:
        return 0, n
    if branch_diverged(ep):
        return 0, 0
    k = int(info["turn"])
    return k, k + 1


def branch_diverged(ep: Episode) -> bool:
    """True when a branch's re-play did not reach the state it was meant to branch from."""
    info = ep.metadata.get("branch")
    if not info:
        return False
    path = ep.path()
    k = int(info["turn"])
    return len(path) <= k or path[k].state_key != info["state_key"]
