"""Credit estimators: hand-computed values, edge-case rules, and vectorised == reference loops."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arborl.credit import (
    StepBatch,
    best_return_weights,
    best_return_weights_reference,
    best_step,
    discounted_returns,
    gigpo,
    grpo,
    grpo_advantages,
    grpo_advantages_reference,
    step_group_advantages,
    step_group_advantages_reference,
)


def test_grpo_hand_computed():
    # group 0: scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3)
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]))
    s = math.sqrt(1 / 3)
    expected = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-5)


def test_grpo_singleton_gets_raw_score_and_equal_group_gets_zero():
    adv = grpo_advantages(torch.tensor([0.7, 1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 1, 1, 2, 2]))
    assert adv[0].item() == 0.7 or abs(adv[0].item() - 0.7 / (1 + 1e-6)) < 1e-6
    assert adv[1:].abs().max().item() == 0.0


def test_grpo_without_std_is_mean_centred():
    adv = grpo_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), norm_by_std=False)
    assert adv.tolist() == [1.0, -1.0]


def test_discounted_returns_hand_computed():
    # episode 0: rewards 0, 0, 1 ; episode 1: 1, 0 (listed out of order)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    episode = torch.tensor([0, 1, 0, 1, 0])
    step = torch.tensor([2, 1, 0, 0, 1])
    g = discounted_returns(rewards, episode, step, gamma=0.5)
    assert torch.allclose(g, torch.tensor([1.0, 0.0, 0.25, 1.0, 0.5]))


def test_step_groups_singleton_zero():
    a = step_group_advantages(torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0, 0, 1]), norm_by_std=False)
    assert a.tolist() == [0.25, -0.25, 0.0]


def test_gigpo_hand_computed():
    # one group, two episodes on the same map; both start in state 7.
    # ep0: state 7 -> 8 -> success (rewards 0, 1); ep1: state 7 -> fail (reward 0)
    b = StepBatch(
        episode=torch.tensor([0, 0, 1]),
        step=torch.tensor([0, 1, 0]),
        reward=torch.tensor([0.0, 1.0, 0.0]),
        anchor=torch.tensor([7, 8, 7]),
        group=torch.tensor([0, 0]),
        score=torch.tensor([1.0, 0.0]),
    )
    a = gigpo(b, gamma=0.5, step_weight=1.0, norm_by_std=False)
    # A^E = +0.5 / -0.5 ; returns: 0.5, 1.0, 0.0 ; step group {s7: 0.5, 0.0} -> +0.25, -0.25 ; s8 singleton 0
    assert torch.allclose(a, torch.tensor([0.75, 0.5, -0.75]))
    g = grpo(b, norm_by_std=False)
    assert g.tolist() == [0.5, 0.5, -0.5]


def test_length_neutral_equalises_episode_weight():
    b = StepBatch(
        episode=torch.tensor([0, 0, 0, 1]),
        step=torch.tensor([0, 1, 2, 0]),
        reward=torch.zeros(4),
        anchor=torch.arange(4),
        group=torch.tensor([0, 0]),
        score=torch.tensor([0.0, 1.0]),
    )
    a = grpo(b, norm_by_std=False, length_neutral=True)
    # mean turns 2; ep0 (3 turns) weight 2/3 each, ep1 (1 turn) weight 2: totals -0.5*2 and 0.5*2
    assert torch.allclose(a[:3].sum(), torch.tensor(-1.0)) and torch.allclose(a[3], torch.tensor(1.0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-5, 5)), min_size=1, max_size=30), st.booleans())
def test_vectorised_matches_reference(rows, norm):
    groups = sorted({g for g, _ in rows})
    remap = {g: i for i, g in enumerate(groups)}
    gid = [remap[g] for g, _ in rows]
    vals = [v for _, v in rows]
    fast = grpo_advantages(torch.tensor(vals, dtype=torch.float64), torch.tensor(gid), norm_by_std=norm)
    slow = grpo_advantages_reference(vals, gid, norm_by_std=norm)
    assert torch.allclose(fast, torch.tensor(slow, dtype=torch.float32), atol=1e-3, rtol=1e-4)
    fast_s = step_group_advantages(torch.tensor(vals, dtype=torch.float64), torch.tensor(gid), norm_by_std=norm)
    slow_s = step_group_advantages_reference(vals, gid, norm_by_std=norm)
    assert torch.allclose(fast_s, torch.tensor(slow_s, dtype=torch.float32), atol=1e-3, rtol=1e-4)
    rounded = [round(v) / 2 for v in vals]  # ties are common in real returns
    fast_b = best_return_weights(torch.tensor(rounded, dtype=torch.float64), torch.tensor(gid))
    assert torch.allclose(fast_b, torch.tensor(best_return_weights_reference(rounded, gid)), atol=1e-6)


def test_best_return_weights_hand_computed():
    # group 0: 0.9, 0.0, 0.9, 0.5 -> the two 0.9s share weight; group 1: all equal -> 0; group 2: singleton -> 0
    w = best_return_weights(torch.tensor([0.9, 0.0, 0.9, 0.5, 1.0, 1.0, 0.3]), torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    assert w.tolist() == [0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_best_step_reinforces_the_best_action_of_each_state_only():
    # A trunk takes "a" at s7 then reaches the goal at s8 (rewards 0, 1). Branch 1 re-plays s7 and
    # tries "b" at s8: hole (0). Branch 2 tries "c" at s7 and reaches the goal in two more steps.
    b = StepBatch(
        episode=torch.tensor([0, 0, 1, 1, 2, 2, 2]),
        step=torch.tensor([0, 1, 0, 1, 0, 1, 2]),
        reward=torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
        anchor=torch.tensor([7, 8, 7, 8, 7, 9, 8]),
        group=torch.tensor([0, 0, 0]),
        score=torch.tensor([1.0, 0.0, 1.0]),
        active=torch.tensor([True, True, False, True, True, False, False]),
        sampled=torch.tensor([True, False, False]),
    )
    a = best_step(b, gamma=0.5)
    # s7: trunk return 0.5, branch-2 return 0.25 -> the trunk's step is best; s8: 1.0 vs 0.0 -> trunk.
    # Inactive steps (re-play, continuation) get nothing, whatever their returns.
    assert a.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_gigpo_branch_steps_hand_computed():
    # One group on one map. Ep0 is a policy sample: state 7 -> 8 -> goal (rewards 0, 1).
    # Ep1 is a branch: it re-plays ep0's first turn (state 7, inactive), then forces another
    # action at state 8 that falls into a hole (reward 0).
    b = StepBatch(
        episode=torch.tensor([0, 0, 1, 1]),
        step=torch.tensor([0, 1, 0, 1]),
        reward=torch.tensor([0.0, 1.0, 0.0, 0.0]),
        anchor=torch.tensor([7, 8, 7, 8]),
        group=torch.tensor([0, 0]),
        score=torch.tensor([1.0, 0.0]),
        active=torch.tensor([True, True, False, True]),
        sampled=torch.tensor([True, False]),
    )
    a = gigpo(b, gamma=0.5, step_weight=1.0, norm_by_std=False)
    # A^E: only ep0 is sampled -> singleton group -> A^E = score = 1 for ep0, 0 for the branch.
    # Step groups: s7 holds ep0's step only (the re-play is inactive) -> 0;
    # s8 holds returns 1.0 (ep0) and 0.0 (branch) -> +0.5 / -0.5. The re-played step gets 0.
    assert torch.allclose(a, torch.tensor([1.0, 1.5, 0.0, -0.5]))
    g = grpo(b, norm_by_std=False)
    assert g.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_length_neutral_counts_active_steps_of_sampled_episodes():
    b = StepBatch(
        episode=torch.tensor([0, 0, 1, 1, 1]),
        step=torch.tensor([0, 1, 0, 1, 2]),
        reward=torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]),
        anchor=torch.tensor([1, 2, 1, 2, 3]),
        group=torch.tensor([0, 0]),
        score=torch.tensor([1.0, 0.0]),
        active=torch.tensor([True, True, False, True, True]),
        sampled=torch.tensor([True, False]),
    )
    a = gigpo(b, gamma=1.0, step_weight=1.0, norm_by_std=False, length_neutral=True)
    # mean length of sampled episodes = 2; the branch has 2 active steps -> weight 1 everywhere.
    # A^E = [1, 1, 0, 0, 0]; s2 group: returns 1.0 (ep0) and 0.0 (branch) -> +0.5/-0.5; s3 singleton.
    assert torch.allclose(a, torch.tensor([1.0, 1.5, 0.0, -0.5, 0.0]))


def test_step_batch_rejects_bad_masks():
    import pytest

    with pytest.raises(ValueError, match="active"):
        StepBatch(episode=torch.tensor([0]), step=torch.tensor([0]), reward=torch.zeros(1), anchor=torch.tensor([0]),
                  group=torch.tensor([0]), score=torch.zeros(1), active=torch.tensor([1]))
