"""Tree credit: node values are the mean score of the leaves below, advantages value differences."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arborl.credit import StepBatch, tree, tree_advantages, tree_reference, tree_values
from arborl.train.batch import step_batch
from arborl.trajectory import Episode, Origin, Turn


def _episode(eid: str, turn_names: list[str], score: float, *, prefix: list[Turn] = (),
             origin: Origin | None = None) -> Episode:
    ep = Episode(episode_id=eid, group_id="g", seed=0, rewards={"success": score}, origin=origin)
    ep.turns = list(prefix)
    parent = prefix[-1].turn_id if prefix else None
    for name in turn_names:
        ep.add_turn(Turn(turn_id=name, parent_id=parent, index=len(ep.turns), state_key=name))
        parent = name
    return ep


def uneven_tree() -> list[Episode]:
    """Two trunks; the root turn a0 has three children (a1, c1, d1), b0 two (b1, e1), c1 two (c2, f2)."""
    a = _episode("A", ["a0", "a1", "a2"], 1.0)
    b = _episode("B", ["b0", "b1"], 0.0)
    c = _episode("C", ["c1", "c2"], 0.0, prefix=a.turns[:1], origin=Origin(of="A", turn=1, kind="tree", state_key="a1"))
    c.turns[1].state_key = "a1"  # re-sampled from the state the trunk's turn a1 acted from
    d = _episode("D", ["d1"], 0.0, prefix=a.turns[:1], origin=Origin(of="A", turn=1, kind="tree", state_key="d1"))
    e = _episode("E", ["e1"], 1.0, prefix=b.turns[:1], origin=Origin(of="B", turn=1, kind="tree", state_key="e1"))
    f = _episode("F", ["f2"], 1.0, prefix=c.path()[:2], origin=Origin(of="C", turn=2, kind="tree", state_key="f2"))
    return [a, b, c, d, e, f]


def test_uneven_tree_by_hand():
    steps = step_batch(uneven_tree())
    # rows: A a0 a1 a2 | B b0 b1 | C a0 c1 c2 | D a0 d1 | E b0 e1 | F a0 c1 f2
    # nodes (first seen): a0 a1 a2 b0 b1 c1 c2 d1 e1 f2
    assert steps.node.tolist() == [0, 1, 2, 3, 4, 0, 5, 6, 0, 7, 3, 8, 0, 5, 9]
    assert steps.parent.tolist() == [-1, 0, 1, -1, 3, 0, 5, 0, 3, 5]
    values, roots = tree_values(steps)
    # V(a0) = mean(A, C, D, F) = (1 + 0 + 0 + 1) / 4; V(c1) = mean(C, F); V(b0) = mean(B, E); root = 3/6
    assert values.tolist() == [0.5, 1.0, 1.0, 0.5, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0]
    assert roots.tolist() == [0.5]
    # A^T = V(node) - V(parent); a shared prefix row is credited in its trunk's row only
    want_tree = [0.0, 0.5, 0.0, 0.0, -0.5, 0, 0.0, -0.5, 0, -0.5, 0, 0.5, 0, 0, 0.5]
    assert tree_advantages(steps).tolist() == want_tree
    # plus the GRPO term over the sampled trunks A (1) and B (0): +-0.5 without the std
    adv = tree(steps, episode_weight=1.0, norm_by_std=False)
    assert adv.tolist() == [0.5, 1.0, 0.5, -0.5, -1.0, 0, 0.0, -0.5, 0, -0.5, 0, 0.5, 0, 0, 0.5]
    assert adv.tolist() == tree_reference(steps, episode_weight=1.0, norm_by_std=False)
    assert tree(steps, episode_weight=0.0).tolist() == want_tree


def test_a_diverged_continuation_is_no_leaf():
    eps = uneven_tree()
    eps[3].origin = Origin(of="A", turn=1, kind="tree", state_key="elsewhere")  # D did not reach its state
    values, roots = tree_values(step_batch(eps))
    assert values[0].item() == pytest.approx(2 / 3)  # a0: A, C, F (D left out)
    assert roots.tolist() == pytest.approx([0.6])


def test_without_the_tree_structure_the_error_names_the_fix():
    b = StepBatch(episode=torch.tensor([0]), step=torch.tensor([0]), reward=torch.zeros(1), anchor=torch.tensor([0]),
                  group=torch.tensor([0]), score=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="needs StepBatch.node and StepBatch.parent"):
        tree(b)


def random_forest(seed: int) -> StepBatch:
    """Groups of trunks with continuations of trunks and of continuations, some inactive, interleaved."""
    rng = random.Random(seed)
    episode, node, parent, group, score, active = [], [], [], [], [], []
    paths: list[list[int]] = []
    for _ in range(rng.randint(1, 12)):
        g = rng.randint(0, 2)
        same = [e for e in range(len(paths)) if group[e] == g and paths[e]]
        prefix = []
        if same and rng.random() < 0.6:
            src = paths[rng.choice(same)]
            prefix = src[: rng.randint(1, len(src))]
        own = []
        for _ in range(rng.randint(0 if prefix else 1, 4)):
            parent.append(own[-1] if own else (prefix[-1] if prefix else -1))
            own.append(len(parent) - 1)
        e = len(paths)
        paths.append(prefix + own)
        group.append(g)
        score.append(rng.choice([0.0, 1.0, 0.5, rng.uniform(-2, 2)]))
        live = rng.random() > 0.15
        for k, n in enumerate(prefix + own):
            episode.append(e)
            node.append(n)
            active.append(live and k >= len(prefix))
    dense = {g: i for i, g in enumerate(dict.fromkeys(group))}
    n = len(episode)
    return StepBatch(
        episode=torch.tensor(episode, dtype=torch.long), step=torch.tensor([0] * n), reward=torch.zeros(n),
        anchor=torch.arange(n), group=torch.tensor([dense[g] for g in group]),
        score=torch.tensor(score, dtype=torch.float32), active=torch.tensor(active, dtype=torch.bool),
        sampled=torch.tensor([rng.random() < 0.7 for _ in group], dtype=torch.bool),
        node=torch.tensor(node, dtype=torch.long), parent=torch.tensor(parent, dtype=torch.long))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**6), st.floats(0, 2), st.booleans(), st.booleans(), st.sampled_from(["raw", "zero"]))
def test_vectorised_tree_equals_the_reference_loop(seed, weight, norm, length_neutral, singleton):
    b = random_forest(seed)
    kw = {"episode_weight": weight, "norm_by_std": norm, "length_neutral": length_neutral, "singleton": singleton}
    assert torch.allclose(tree(b, **kw), torch.tensor(tree_reference(b, **kw)), atol=1e-5)
