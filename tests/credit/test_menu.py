"""RLOO, Dr.GRPO, the singleton rule and the StarPO-S filter: hand-computed vectors and vectorised == reference."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arborl.credit import (
    StepBatch,
    best_step,
    credit_on_groups,
    dr_grpo,
    gigpo,
    group_score_std,
    grpo,
    grpo_advantages,
    rloo,
    rloo_advantages,
    rloo_advantages_reference,
    starpo_s_groups,
    starpo_s_groups_reference,
)
from arborl.credit import reference as ref


def one_step_episodes(scores, groups, **kw):
    """A batch of one-step episodes (so step advantages are episode advantages)."""
    n = len(scores)
    return StepBatch(episode=torch.arange(n), step=torch.zeros(n, dtype=torch.long), reward=torch.zeros(n),
                     anchor=torch.arange(n), group=torch.tensor(groups), score=torch.tensor(scores), **kw)


def close(a, b):
    return torch.allclose(a, torch.tensor(b, dtype=torch.float32), atol=1e-6)


# ---- RLOO -------------------------------------------------------------------------------------

def test_rloo_hand_computed_leaves_each_episode_out_of_its_own_baseline():
    # 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3
    assert close(rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0])),
                 [2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_rloo_interleaved_groups():
    # group 0 = rows 0, 2, 4 (1, 0, 2): 1 - 1 = 0, 0 - 1.5, 2 - 0.5 ; group 1 = rows 1, 3 (3, 5): -2, +2
    b = one_step_episodes([1.0, 3.0, 0.0, 5.0, 2.0], [0, 1, 0, 1, 0])
    assert close(rloo(b), [0.0, -2.0, -1.5, 2.0, 1.5])


@pytest.mark.parametrize("scores", [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5]])
def test_all_failed_all_succeeded_and_zero_std_groups_get_zero_from_every_group_estimator(scores):
    b = one_step_episodes(scores, [0] * len(scores))
    for est in (grpo, rloo, dr_grpo):
        assert est(b).abs().max().item() == 0.0, est.__name__


@pytest.mark.parametrize("est", [grpo, rloo, dr_grpo])
def test_singleton_group_under_both_rules(est):
    # rows 0 and 3 are alone in their groups; rows 1, 2 a pair (1 vs 0)
    b = one_step_episodes([0.7, 1.0, 0.0, -0.4], [0, 1, 1, 2])
    raw, zero = est(b, singleton="raw"), est(b, singleton="zero")
    scale = 1 / (1 + 1e-6) if est is grpo else 1.0  # grpo divides the lone score by std 1 + eps
    assert close(raw[[0, 3]], [0.7 * scale, -0.4 * scale])
    assert zero[[0, 3]].tolist() == [0.0, 0.0]
    assert torch.equal(raw[1:3], zero[1:3]) and raw[1].item() > 0 > raw[2].item()


def test_singleton_rule_reaches_gigpo_episode_term_but_not_its_step_term():
    # ep0 is the only policy sample of its group (ep1 is a branch that re-plays s7, then tries s8's other action)
    b = StepBatch(episode=torch.tensor([0, 0, 1, 1]), step=torch.tensor([0, 1, 0, 1]),
                  reward=torch.tensor([0.0, 1.0, 0.0, 0.0]), anchor=torch.tensor([7, 8, 7, 8]),
                  group=torch.tensor([0, 0]), score=torch.tensor([1.0, 0.0]),
                  active=torch.tensor([True, True, False, True]), sampled=torch.tensor([True, False]))
    # raw: A^E = 1 for ep0 (see test_gigpo_branch_steps_hand_computed); zero: A^E = 0, A^S at s8 stays +-0.5
    assert close(gigpo(b, gamma=0.5, norm_by_std=False, singleton="raw"), [1.0, 1.5, 0.0, -0.5])
    assert close(gigpo(b, gamma=0.5, norm_by_std=False, singleton="zero"), [0.0, 0.5, 0.0, -0.5])


def test_unknown_singleton_rule_is_refused():
    with pytest.raises(ValueError, match="singleton = 'none' is unknown"):
        rloo_advantages(torch.tensor([1.0]), torch.tensor([0]), singleton="none")


# ---- Dr.GRPO ----------------------------------------------------------------------------------

def test_dr_grpo_is_mean_centred_without_std_or_length_scaling():
    # ep0: 3 turns, score 0 ; ep1: 1 turn, score 1 -> mean 0.5, A = -0.5 / +0.5 on every turn
    b = StepBatch(episode=torch.tensor([0, 0, 0, 1]), step=torch.tensor([0, 1, 2, 0]), reward=torch.zeros(4),
                  anchor=torch.arange(4), group=torch.tensor([0, 0]), score=torch.tensor([0.0, 1.0]))
    assert close(dr_grpo(b), [-0.5, -0.5, -0.5, 0.5])
    s = math.sqrt(0.5)  # GRPO divides by the unbiased std of (0, 1)
    assert close(grpo(b), [-0.5 / (s + 1e-6)] * 3 + [0.5 / (s + 1e-6)])
    # length_neutral GRPO would scale: mean turns 2 -> ep0 x 2/3, ep1 x 2
    assert close(grpo(b, norm_by_std=False, length_neutral=True), [-1 / 3] * 3 + [1.0])


def test_dr_grpo_interleaved_groups():
    b = one_step_episodes([1.0, 3.0, 0.0, 5.0, 2.0], [0, 1, 0, 1, 0])
    assert close(dr_grpo(b), [0.0, -1.0, -1.0, 1.0, 1.0])


# ---- StarPO-S --------------------------------------------------------------------------------

def starpo_batch():
    """Four groups of four, interleaved: stds g0 = g3 = sqrt(1/3) (a tie), g2 = 0.5, g1 = 0."""
    scores = {0: [1, 0, 1, 0], 1: [0, 0, 0, 0], 2: [1, 0, 0, 0], 3: [1, 1, 0, 0]}
    rows = [(g, scores[g][k]) for k in range(4) for g in range(4)]  # g0, g1, g2, g3, g0, g1, ...
    return one_step_episodes([float(s) for _, s in rows], [g for g, _ in rows])


def test_group_score_std_hand_computed():
    std = group_score_std(starpo_batch())
    assert torch.allclose(std, torch.tensor([math.sqrt(1 / 3), 0.0, 0.5, math.sqrt(1 / 3)], dtype=torch.float64))


@pytest.mark.parametrize("ratio,kept", [
    (0.25, [True, False, False, False]),   # one group: of the tied g0 and g3 the lower id wins
    (0.5, [True, False, False, True]),     # the tie, both
    (0.75, [True, False, True, True]),
    (1.0, [True, True, True, True]),
    (0.1, [True, False, False, False]),    # ceil(0.4) = 1, never 0 by rounding
])
def test_starpo_s_keeps_the_largest_std_groups_with_ties_by_group_id(ratio, kept):
    b = starpo_batch()
    assert starpo_s_groups(b, keep_ratio=ratio).tolist() == kept
    assert starpo_s_groups_reference(b, keep_ratio=ratio) == kept


def test_starpo_s_keep_count_ignores_float_noise():
    b = one_step_episodes([float(g % 3) for g in range(20)], [g // 2 for g in range(20)])  # 10 groups
    assert int(starpo_s_groups(b, keep_ratio=0.3).sum()) == 3  # 0.3 * 10 = 3.0000000000000004


def test_starpo_s_empty_selection_gives_zero_credit_and_no_crash():
    b = one_step_episodes([0.0, 0.0, 1.0, 1.0, 0.0], [0, 0, 1, 1, 2])  # every group agrees (g2 a singleton)
    keep = starpo_s_groups(b, keep_ratio=1.0, keep_zero_std=False)
    assert keep.tolist() == [False, False, False]
    assert starpo_s_groups_reference(b, keep_ratio=1.0, keep_zero_std=False) == [False, False, False]
    assert credit_on_groups(lambda x: rloo(x, singleton="raw"), b, keep).tolist() == [0.0] * 5
    # keeping zero-std groups, the same batch keeps the first ceil(0.5 * 3) = 2 by id
    assert starpo_s_groups(b, keep_ratio=0.5).tolist() == [True, True, False]


def test_starpo_s_ranks_only_sampled_episodes():
    # g0's spread comes from a branch only; g1's from its samples
    b = one_step_episodes([1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 0, 1, 1],
                          sampled=torch.tensor([True, True, False, True, True]))
    assert starpo_s_groups(b, keep_ratio=0.5).tolist() == [False, True]


def test_starpo_s_refuses_a_ratio_outside_0_1():
    with pytest.raises(ValueError, match="keep_ratio is 0"):
        starpo_s_groups(starpo_batch(), keep_ratio=0)


def test_credit_on_groups_runs_the_estimator_on_the_kept_groups_only():
    # g0: ep0 (3 turns, score 1), ep1 (1 turn, 0); g1: ep2 (1 turn, 1), ep3 (1 turn, 1) -> dropped
    b = StepBatch(episode=torch.tensor([0, 0, 0, 1, 2, 3]), step=torch.tensor([0, 1, 2, 0, 0, 0]),
                  reward=torch.zeros(6), anchor=torch.arange(6), group=torch.tensor([0, 0, 1, 1]),
                  score=torch.tensor([1.0, 0.0, 1.0, 1.0]))
    out = credit_on_groups(lambda x: rloo(x, length_neutral=True), b, torch.tensor([True, False]))
    # kept: mean turns over ep0, ep1 = 2 -> ep0 (+1) x 2/3 on each of 3 turns, ep1 (-1) x 2 ; g1 zeros
    assert close(out, [2 / 3, 2 / 3, 2 / 3, -2.0, 0.0, 0.0])


# ---- vectorised == reference on random batches ------------------------------------------------

@st.composite
def step_batches(draw):
    """Random batches: uneven groups and lengths, shuffled rows, tied scores, revisits, branch masks."""
    n_groups = draw(st.integers(1, 4))
    episodes = draw(st.lists(st.tuples(st.integers(0, n_groups - 1), st.integers(1, 4)), min_size=1, max_size=10))
    used = sorted({g for g, _ in episodes})
    group = [used.index(g) for g, _ in episodes]
    rows = [(e, k) for e, (_, t) in enumerate(episodes) for k in range(t)]
    order = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in order]
    value = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0]), st.integers(-200, 200).map(lambda v: v / 100))
    n, e = len(rows), len(episodes)
    active = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=n, max_size=n)))
    sampled = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=e, max_size=e)))
    return StepBatch(
        episode=torch.tensor([r[0] for r in rows]), step=torch.tensor([r[1] for r in rows]),
        reward=torch.tensor(draw(st.lists(value, min_size=n, max_size=n))),
        anchor=torch.tensor(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))),
        group=torch.tensor(group), score=torch.tensor(draw(st.lists(value, min_size=e, max_size=e))),
        active=None if active is None else torch.tensor(active), sampled=None if sampled is None else torch.tensor(sampled),
    )


def agree(fast, slow):
    assert torch.allclose(fast, torch.tensor(slow, dtype=torch.float32), atol=1e-3, rtol=1e-4), (fast, slow)


@settings(max_examples=150, deadline=None)
@given(step_batches(), st.booleans(), st.booleans(), st.sampled_from(["raw", "zero"]))
def test_every_estimator_matches_its_reference_loop(b, norm, neutral, singleton):
    agree(grpo(b, norm_by_std=norm, length_neutral=neutral, singleton=singleton),
          ref.grpo_reference(b, norm_by_std=norm, length_neutral=neutral, singleton=singleton))
    agree(rloo(b, length_neutral=neutral, singleton=singleton),
          ref.rloo_reference(b, length_neutral=neutral, singleton=singleton))
    agree(dr_grpo(b, singleton=singleton), ref.dr_grpo_reference(b, singleton=singleton))
    agree(gigpo(b, gamma=0.9, step_weight=0.5, norm_by_std=norm, length_neutral=neutral, singleton=singleton),
          ref.gigpo_reference(b, gamma=0.9, step_weight=0.5, norm_by_std=norm, length_neutral=neutral,
                              singleton=singleton))
    agree(best_step(b, gamma=0.9), ref.best_step_reference(b, gamma=0.9))


@settings(max_examples=150, deadline=None)
@given(step_batches(), st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]), st.booleans())
def test_starpo_s_and_filtered_credit_match_their_reference_loops(b, ratio, zero_std):
    keep = starpo_s_groups(b, keep_ratio=ratio, keep_zero_std=zero_std)
    assert keep.tolist() == starpo_s_groups_reference(b, keep_ratio=ratio, keep_zero_std=zero_std)
    # filtered credit = the reference estimator run on the kept episodes only, zeros elsewhere
    ep_keep = keep[b.group]
    sub, rows = b.select_episodes(ep_keep)
    expected = [0.0] * b.episode.numel()
    if rows.numel():
        for r, v in zip(rows.tolist(), ref.rloo_reference(sub, length_neutral=True), strict=True):
            expected[r] = v
    agree(credit_on_groups(lambda x: rloo(x, length_neutral=True), b, keep), expected)
    assert sorted(set(sub.group.tolist())) == list(range(int(keep.sum()) if sub.group.numel() else 0))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-20, 20)), min_size=1, max_size=30), st.sampled_from(["raw", "zero"]))
def test_rloo_advantages_match_reference(rows, singleton):
    used = sorted({g for g, _ in rows})
    gid = [used.index(g) for g, _ in rows]
    vals = [v / 4 for _, v in rows]
    fast = rloo_advantages(torch.tensor(vals, dtype=torch.float64), torch.tensor(gid), singleton=singleton)
    agree(fast, rloo_advantages_reference(vals, gid, singleton=singleton))
    # the identity RLOO rests on: n/(n-1) times GRPO's mean-centred advantage
    n = torch.bincount(torch.tensor(gid))[torch.tensor(gid)].to(torch.float32)
    centred = grpo_advantages(torch.tensor(vals), torch.tensor(gid), norm_by_std=False)
    assert torch.allclose(torch.where(n > 1, fast, 0.0), torch.where(n > 1, centred * n / (n - 1).clamp_min(1), 0.0),
                          atol=1e-5)
