"""Credit estimator benchmark: every estimator on one large batch, one core, against its reference loop.

    python bench/credit.py                     # 100,000 steps in 1,000 groups of 8 episodes
    python bench/credit.py --steps 20000 --groups 200

The batch looks like FrozenLake/Sokoban experience: 8 episodes per group, lengths 1-24 turns
(trimmed so the rows add up to ``--steps`` exactly), 16 states per group (so anchor-state groups
repeat), a sparse success reward on the last turn plus small per-turn shaping and penalties.
Each row times the vectorised function (best of ``--repeat``) and its slow reference loop from
:mod:`arborl.credit.reference` (once), checks they agree, and prints the ratio. The target is
under 1 second for every vectorised estimator.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from arborl import credit
from arborl.credit import StepBatch
from arborl.credit import reference as ref

TARGET_S = 1.0


def make_batch(steps: int, groups: int, group_size: int = 8, seed: int = 0) -> StepBatch:
    """A synthetic batch of exactly ``steps`` step rows in ``groups`` groups."""
    rng = np.random.default_rng(seed)
    n_ep = groups * group_size
    lengths = rng.integers(1, 25, n_ep)
    while lengths.sum() != steps:  # trim or extend random episodes until the rows add up
        i = rng.integers(n_ep)
        lengths[i] = max(1, lengths[i] + (1 if lengths.sum() < steps else -1))
    episode = np.repeat(np.arange(n_ep), lengths)
    step = np.concatenate([np.arange(t) for t in lengths])
    group = np.arange(n_ep) // group_size
    success = rng.random(n_ep) < 0.4
    reward = rng.choice([0.0, 0.1, -0.1, -1.0], size=steps, p=[0.5, 0.2, 0.2, 0.1])
    last = np.cumsum(lengths) - 1
    reward[last] += success
    anchor = group[episode] * 16 + rng.integers(0, 16, steps)
    score = success.astype(np.float32) - 1.0 * np.bincount(episode, weights=reward == -1.0, minlength=n_ep)
    return StepBatch(episode=torch.from_numpy(episode), step=torch.from_numpy(step),
                     reward=torch.from_numpy(reward).to(torch.float32), anchor=torch.from_numpy(anchor),
                     group=torch.from_numpy(group), score=torch.from_numpy(score).to(torch.float32))


def _filtered_reference(b: StepBatch) -> list[float]:
    """GRPO on the StarPO-S-kept groups, all by reference loops."""
    keep = torch.tensor(credit.starpo_s_groups_reference(b, keep_ratio=0.25))
    sub, rows = b.select_episodes(keep[b.group])
    out = [0.0] * b.episode.numel()
    for r, v in zip(rows.tolist(), ref.grpo_reference(sub, length_neutral=True), strict=True):
        out[r] = v
    return out


def critic_inputs(b: StepBatch, seed: int = 1) -> dict[str, torch.Tensor]:
    """Stand-ins for a critic's outputs on ``b``: values, Q-values and per-episode bootstrap inputs."""
    gen = torch.Generator().manual_seed(seed)
    n, e = b.episode.numel(), b.group.numel()
    return {"values": torch.rand(n, generator=gen), "q_values": torch.rand(n, generator=gen),
            "episode_next_value": torch.rand(e, generator=gen), "episode_truncated": torch.rand(e, generator=gen) < 0.3}


def _turn_ppo(fn):
    def run(b):
        x = critic_inputs(b)
        return fn(b, values=x["values"], episode_next_value=x["episode_next_value"],
                  episode_truncated=x["episode_truncated"], gamma=0.95, lam=0.9, whiten=True)
    return run


def _archer(fn):
    def run(b):
        x = critic_inputs(b)
        return fn(b, q_values=x["q_values"], values=x["values"])
    return run


def with_tree(b: StepBatch, seed: int = 2) -> StepBatch:
    """``b`` as tree rollouts: in each group, episodes 1-7 continue episode 0 from one of its turns.

    A continuation re-plays the trunk's first ``p`` turns (the same nodes, inactive rows, as the
    rollout stores them), then takes turns of its own (new nodes, each the child of the one before).
    """
    rng = np.random.default_rng(seed)
    episode, step, group = b.episode.numpy(), b.step.numpy(), b.group.numpy()
    lengths = np.bincount(episode, minlength=group.size)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    node, parent = np.arange(episode.size), np.full(episode.size, -1)
    active = np.ones(episode.size, dtype=bool)
    trunk = {}
    for e in range(group.size):
        rows = start[e] + np.arange(lengths[e])
        t = trunk.setdefault(int(group[e]), e)
        prefix = 0 if t == e else int(rng.integers(0, min(lengths[t], lengths[e] - 1) + 1))
        node[rows[:prefix]] = start[t] + np.arange(prefix)
        active[rows[:prefix]] = False
        own = rows[prefix:]
        parent[own[1:]] = own[:-1]
        parent[own[0]] = start[t] + prefix - 1 if prefix else -1
    assert (step[start] == 0).all()
    return StepBatch(episode=b.episode, step=b.step, reward=b.reward, anchor=b.anchor, group=b.group, score=b.score,
                     active=torch.from_numpy(active), node=torch.from_numpy(node), parent=torch.from_numpy(parent))


def step_scores(b: StepBatch, seed: int = 3) -> torch.Tensor:
    """Stand-ins for a process reward model's step scores on ``b``."""
    return torch.rand(b.episode.numel(), generator=torch.Generator().manual_seed(seed))


_DERIVED: dict[tuple[str, int], object] = {}


def _derived(name: str, build: Callable[[StepBatch], object], b: StepBatch):
    """``build(b)``, made once per batch: the inputs an estimator takes are not part of its time."""
    key = (name, id(b))
    if key not in _DERIVED:
        _DERIVED[key] = build(b)
    return _DERIVED[key]


def _process(fn, **options):
    # the options the CLI passes by default: explicit prm (gamma 0, group baseline), the implicit PRMs
    # (gamma 1, leave-one-out baseline), never the step term's std division; prm_gigpo adds the anchor term
    return lambda b: fn(b, step_scores=_derived("scores", step_scores, b), step_norm_by_std=False, **options)


def _tree(fn):
    return lambda b: fn(_derived("tree", with_tree, b))


def cases() -> list[tuple[str, Callable[[StepBatch], torch.Tensor], Callable[[StepBatch], list]]]:
    """(name, vectorised, reference) of every estimator with the options the CLI passes by default."""
    return [
        ("grpo", lambda b: credit.grpo(b, length_neutral=True), lambda b: ref.grpo_reference(b, length_neutral=True)),
        ("rloo", lambda b: credit.rloo(b, length_neutral=True), lambda b: ref.rloo_reference(b, length_neutral=True)),
        ("dr_grpo", credit.dr_grpo, ref.dr_grpo_reference),
        ("gigpo", lambda b: credit.gigpo(b, length_neutral=True), lambda b: ref.gigpo_reference(b, length_neutral=True)),
        ("best_step", credit.best_step, ref.best_step_reference),
        ("starpo_s filter", lambda b: credit.starpo_s_groups(b, keep_ratio=0.25),
         lambda b: credit.starpo_s_groups_reference(b, keep_ratio=0.25)),
        ("grpo + starpo_s", lambda b: credit.credit_on_groups(
            lambda x: credit.grpo(x, length_neutral=True), b, credit.starpo_s_groups(b, keep_ratio=0.25)),
         _filtered_reference),
        ("turn_ppo", _turn_ppo(credit.turn_gae), _turn_ppo(ref.turn_gae_reference)),
        ("archer", _archer(credit.archer), _archer(ref.archer_reference)),
        ("prm", _process(credit.process, gamma=0.0, baseline="group"),
         _process(ref.process_reference, gamma=0.0, baseline="group")),
        ("implicit_prm", _process(credit.process, gamma=1.0, baseline="rloo"),
         _process(ref.process_reference, gamma=1.0, baseline="rloo")),
        ("prm_gigpo", _process(credit.process, gamma=0.0, baseline="group", anchor_weight=1.0),
         _process(ref.process_reference, gamma=0.0, baseline="group", anchor_weight=1.0)),
        ("tree", _tree(credit.tree), _tree(credit.tree_reference)),
    ]


def _time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; exit 1 when an estimator misses the target or disagrees."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    b = make_batch(args.steps, args.groups)
    table = Table(title=f"credit estimators: {args.steps:,} steps, {b.group.numel():,} episodes, "
                        f"{args.groups:,} groups, 1 thread")
    for col in ("estimator", "vectorised", "reference loop", "ratio", "max |diff|", f"< {TARGET_S:.0f} s"):
        table.add_column(col, justify="left" if col == "estimator" else "right")
    ok = True
    for name, fast, slow in cases():
        t_fast, out = _time(functools.partial(fast, b), args.repeat)
        t_slow, expected = _time(functools.partial(slow, b), 1)
        diff = float((out.to(torch.float64) - torch.tensor(expected, dtype=torch.float64)).abs().max())
        good = t_fast < TARGET_S and diff < 1e-3
        ok &= good
        table.add_row(name, f"{t_fast * 1e3:.1f} ms", f"{t_slow * 1e3:.0f} ms", f"{t_slow / t_fast:.0f}x",
                      f"{diff:.1e}", "yes" if good else "NO")
    Console().print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
