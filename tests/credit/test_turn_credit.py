"""Turn-PPO's turn-level GAE and ArCHer's Q - V: hand-computed vectors, unbiasedness under variable turn
counts (verl RFC #7244), vectorised == reference loop, and the extra-tensor slicing of credit_on_groups."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_menu import step_batches

from arborl.credit import StepBatch, archer, credit_on_groups, turn_gae, turn_gae_returns, whiten_by_episode
from arborl.credit import reference as ref
from arborl.credit.advantages import discounted_returns


def episodes(rewards_per_episode, groups=None):
    """A batch from per-episode reward lists (rows in episode order)."""
    ep, step, rew = [], [], []
    for e, rs in enumerate(rewards_per_episode):
        ep += [e] * len(rs)
        step += list(range(len(rs)))
        rew += rs
    n, n_ep = len(ep), len(rewards_per_episode)
    return StepBatch(episode=torch.tensor(ep), step=torch.tensor(step), reward=torch.tensor(rew, dtype=torch.float32),
                     anchor=torch.arange(n), group=torch.tensor(groups or [0] * n_ep),
                     score=torch.zeros(n_ep))


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def gae(b, values, next_value, truncated, gamma, lam, whiten=False):
    return turn_gae(b, values=t(values), episode_next_value=t(next_value),
                    episode_truncated=torch.tensor(truncated), gamma=gamma, lam=lam, whiten=whiten)


def close(a, b, tol=1e-5):
    return torch.allclose(a, t(b), atol=tol)


# ---- hand-computed vectors ---------------------------------------------------------------------

def test_termination_does_not_bootstrap_and_truncation_does():
    # rewards (0, 1), V = (0.5, 0.2), gamma 0.9, lambda 0.8
    # terminated: d1 = 1 - 0.2 = 0.8 ; d0 = 0.9*0.2 - 0.5 = -0.32 ; A0 = -0.32 + 0.72*0.8 = 0.256
    # truncated, V_next 0.4: d1 = 1 + 0.36 - 0.2 = 1.16 ; A0 = -0.32 + 0.72*1.16 = 0.5152
    b = episodes([[0.0, 1.0]])
    assert close(gae(b, [0.5, 0.2], [0.4], [False], 0.9, 0.8), [0.256, 0.8])
    assert close(gae(b, [0.5, 0.2], [0.4], [True], 0.9, 0.8), [0.5152, 1.16])


def test_lambda_one_is_the_monte_carlo_return_minus_v():
    rewards, v = [0.1, 0.0, 1.0], [0.3, -0.2, 0.7]
    b = episodes([rewards])
    g = [0.1 + 0.5 * 0.0 + 0.25 * 1.0, 0.0 + 0.5 * 1.0, 1.0]
    assert close(gae(b, v, [9.0], [False], 0.5, 1.0), [gi - vi for gi, vi in zip(g, v, strict=True)])
    # truncated: the bootstrap value enters discounted by gamma^(turns to go)
    g_trunc = [gi + 0.5 ** (3 - k) * 2.0 for k, gi in enumerate(g)]
    assert close(gae(b, v, [2.0], [True], 0.5, 1.0), [gi - vi for gi, vi in zip(g_trunc, v, strict=True)])


def test_lambda_zero_is_the_one_step_td_error():
    rewards, v = [0.1, 0.0, 1.0], [0.3, -0.2, 0.7]
    b = episodes([rewards])
    # r + 0.5 V' - V, V' = 0 after the terminated last turn
    assert close(gae(b, v, [5.0], [False], 0.5, 0.0), [0.1 - 0.1 - 0.3, 0.35 + 0.2, 1.0 - 0.7])


def test_a_single_turn_is_r_minus_v_and_the_critic_targets_are_a_plus_v():
    b = episodes([[1.0], [0.0]])
    adv, ret = turn_gae_returns(b, values=t([0.25, 0.5]), episode_next_value=t([3.0, 3.0]),
                                episode_truncated=torch.tensor([False, False]), gamma=0.9, lam=0.9)
    assert close(adv, [0.75, -0.5]) and close(ret, [1.0, 0.0])


def test_an_all_failed_group_still_gets_critic_based_advantages():
    # every reward 0: GRPO would give 0 everywhere; the critic's values still differ between states
    b = episodes([[0.0, 0.0], [0.0]])
    adv = gae(b, [0.4, 0.1, 0.4], [0.0, 0.0], [False, False], 1.0, 1.0)
    assert close(adv, [-0.4, -0.1, -0.4]) and adv.abs().min() > 0
    # with a critic that predicts the failure (V = 0), nothing is pushed
    assert gae(b, [0.0, 0.0, 0.0], [0.0, 0.0], [False, False], 1.0, 1.0).abs().max() == 0


def test_interleaved_shuffled_rows_and_inactive_steps():
    # rows out of order; the inactive (re-played) first turn of episode 1 gets 0 but is still a state
    b = StepBatch(episode=torch.tensor([1, 0, 1, 0]), step=torch.tensor([1, 1, 0, 0]), reward=t([1.0, 0.0, 0.0, 0.5]),
                  anchor=torch.arange(4), group=torch.tensor([0, 0]), score=torch.zeros(2),
                  active=torch.tensor([True, True, False, True]))
    # gamma 1, lambda 1, V = 0: A = return-to-go; ep0: (0.5, 0), ep1: (1, 1) with its first turn inactive
    assert close(gae(b, [0.0] * 4, [0.0, 0.0], [False, False], 1.0, 1.0), [1.0, 0.0, 0.0, 0.5])


# ---- whitening: every episode weighs the same -----------------------------------------------------

def test_whitening_weighs_each_episode_once_whatever_its_number_of_turns():
    # episode 0: one turn, A = 3 ; episode 1: three turns, A = 0 each.
    # per-episode weights (1 and 1/3 each): mean 1.5 (a per-turn mean would be 0.75),
    # variance (1.5^2 + 3 * 1/3 * 1.5^2) / (2 - 1) = 4.5
    b = episodes([[0.0], [0.0, 0.0, 0.0]])
    out = whiten_by_episode(t([3.0, 0.0, 0.0, 0.0]), b)
    s = math.sqrt(4.5 + 1e-8)
    assert close(out, [1.5 / s, -1.5 / s, -1.5 / s, -1.5 / s])
    # repeating the long episode's turns does not move the statistics
    b10 = episodes([[0.0], [0.0] * 10])
    assert close(whiten_by_episode(t([3.0] + [0.0] * 10), b10), [1.5 / s] + [-1.5 / s] * 10)


def test_whitening_with_zero_spread_and_a_single_episode_stays_finite():
    b = episodes([[0.0, 0.0], [0.0]])
    assert whiten_by_episode(t([0.5, 0.5, 0.5]), b).abs().max() == 0  # std 0: (A - mean) = 0, eps keeps it finite
    one = episodes([[0.0, 0.0]])
    assert close(whiten_by_episode(t([1.0, 3.0]), one), [-1.0, 1.0])  # one episode: the mean is removed only


# ---- unbiased when the policy decides how many turns an episode has (verl RFC #7244) ------------------

def stop_or_continue(p_stop, m, c, r_stop, r_go):
    """At s0 the policy stops (one turn, reward r_stop) or continues: reward c on each of 1 + m turns, r_go at
    the end. A batch whose empirical distribution is the policy's (4 episodes: p_stop = k / 4), and the
    exact values of every state (gamma = 1)."""
    k = round(p_stop * 4)
    go = [c] * m + [c + r_go]
    rewards = [[r_stop]] * k + [go] * (4 - k)
    q_stop, q_go = r_stop, sum(go)
    v0 = p_stop * q_stop + (1 - p_stop) * q_go
    values = [v0] * k + [v for _ in range(4 - k) for v in [v0] + [sum(go[j:]) for j in range(1, m + 1)]]
    return episodes(rewards), values, [True] * k + [False] * (4 - k), q_stop, q_go


@pytest.mark.parametrize("m", [1, 3, 7])
@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_the_first_decision_gets_q_minus_v_whatever_the_number_of_later_turns(m, lam):
    p = 0.25
    b, values, stops, q_stop, q_go = stop_or_continue(p, m, c=0.3, r_stop=0.5, r_go=1.0)
    first = b.step == 0
    adv = gae(b, values, [0.0] * 4, [False] * 4, 1.0, lam)[first]
    # the policy-gradient coefficient on "stop" at s0: mean over samples of A_0 * d log pi(a_0) / d logit_stop
    score = t([(1 - p) if s else -p for s in stops])
    grad = float((adv * score).mean())
    assert grad == pytest.approx(p * (1 - p) * (q_stop - q_go), abs=1e-6)
    # whitening rescales it by a positive factor and does not bias it (E[score] = 0 in this batch)
    white = gae(b, values, [0.0] * 4, [False] * 4, 1.0, lam, whiten=True)[first]
    ratio = float((white * score).mean()) / grad
    assert ratio > 0
    assert float(white[0] - white[-1]) == pytest.approx(ratio * float(adv[0] - adv[-1]), rel=1e-5)


def test_a_per_turn_index_baseline_is_biased_where_turn_level_gae_is_not():
    # the construction #7244 warns about: subtract, at each turn index, the group mean reward of the episodes
    # that reached that index, and sum over the episode's own turns. Continuing then earns -E[r_0] - ... less
    # than it should: the intermediate rewards after turn 0 vanish from the comparison.
    p, m, c = 0.25, 3, 0.3
    b, values, stops, q_stop, q_go = stop_or_continue(p, m, c=c, r_stop=0.5, r_go=1.0)
    rows = {}
    for i, k in enumerate(b.step.tolist()):
        rows.setdefault(k, []).append(i)
    base = {k: sum(b.reward[i] for i in idx) / len(idx) for k, idx in rows.items()}
    naive = [sum(float(b.reward[i] - base[k]) for i, (ee, k) in
                 enumerate(zip(b.episode.tolist(), b.step.tolist(), strict=True)) if ee == e) for e in range(4)]
    score = [(1 - p) if s else -p for s in stops]
    naive_grad = sum(a * s for a, s in zip(naive, score, strict=True)) / 4
    truth = p * (1 - p) * (q_stop - q_go)
    assert abs(naive_grad - truth) > 0.1  # biased by the intermediate rewards
    ours = gae(b, values, [0.0] * 4, [False] * 4, 1.0, 1.0)[b.step == 0]
    assert float((ours * t(score)).mean()) == pytest.approx(truth, abs=1e-6)


# ---- ArCHer ------------------------------------------------------------------------------------

def test_archer_advantage_is_q_minus_v_on_active_steps():
    b = episodes([[0.0, 1.0], [0.0]])
    b.active = torch.tensor([False, True, True])
    assert close(archer(b, q_values=t([1.0, 0.5, 0.2]), values=t([0.5, 0.75, 0.4])), [0.0, -0.25, -0.2])


# ---- vectorised == reference loop ----------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(step_batches(), st.data())
def test_turn_gae_and_archer_match_their_reference_loops(b, data):
    n, e = b.episode.numel(), b.group.numel()
    value = st.integers(-200, 200).map(lambda v: v / 100)
    values = t(data.draw(st.lists(value, min_size=n, max_size=n)))
    q = t(data.draw(st.lists(value, min_size=n, max_size=n)))
    nxt = t(data.draw(st.lists(value, min_size=e, max_size=e)))
    trunc = torch.tensor(data.draw(st.lists(st.booleans(), min_size=e, max_size=e)), dtype=torch.bool)
    gamma = data.draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    lam = data.draw(st.sampled_from([0.0, 0.9, 1.0]))
    whiten = data.draw(st.booleans())
    fast = turn_gae(b, values=values, episode_next_value=nxt, episode_truncated=trunc, gamma=gamma, lam=lam,
                    whiten=whiten)
    slow = ref.turn_gae_reference(b, values=values, episode_next_value=nxt, episode_truncated=trunc, gamma=gamma,
                                  lam=lam, whiten=whiten)
    assert torch.allclose(fast, t(slow), atol=1e-3, rtol=1e-4), (fast, slow)
    assert torch.allclose(archer(b, q_values=q, values=values, whiten=whiten),
                          t(ref.archer_reference(b, q_values=q, values=values, whiten=whiten)), atol=1e-3, rtol=1e-4)


def test_gae_is_discounted_td_errors():
    # the vectorised recursion: A = discounted return of the TD errors with discount gamma * lambda
    b = episodes([[0.0, 1.0, 0.0], [1.0]])
    v = t([0.1, 0.2, 0.3, 0.4])
    delta = b.reward + 0.9 * t([0.2, 0.3, 0.0, 0.0]) - v
    assert torch.allclose(gae(b, v.tolist(), [0.0, 0.0], [False, False], 0.9, 0.5),
                          discounted_returns(delta, b.episode, b.step, gamma=0.45), atol=1e-6)


# ---- credit_on_groups hands the estimator its extra tensors, sliced to the kept groups ------------------------

def test_credit_on_groups_slices_per_step_and_per_episode_inputs():
    # two groups of one-turn and two-turn episodes; keep group 1 only (episodes 1 and 2, rows 2, 3, 4)
    b = StepBatch(episode=torch.tensor([0, 0, 1, 2, 2]), step=torch.tensor([0, 1, 0, 0, 1]),
                  reward=t([0.0, 1.0, 1.0, 0.0, 0.5]), anchor=torch.arange(5), group=torch.tensor([0, 1, 1]),
                  score=torch.zeros(3))
    values, nxt, trunc = t([9.0, 9.0, 0.25, 0.0, 0.5]), t([7.0, 0.0, 2.0]), torch.tensor([True, False, True])
    out = credit_on_groups(lambda s, **kw: turn_gae(s, gamma=1.0, lam=1.0, whiten=False, **kw), b,
                           torch.tensor([False, True]), values=values, episode_next_value=nxt, episode_truncated=trunc)
    # ep1: 1 - 0.25 ; ep2 (truncated, V_next 2): (0 + 0.5 + 2) - 0, (0.5 + 2) - 0.5 ; group 0: 0
    assert close(out, [0.0, 0.0, 0.75, 2.5, 2.0])


def test_credit_on_groups_refuses_an_extra_tensor_of_the_wrong_length():
    b = episodes([[0.0, 1.0], [0.0]])
    with pytest.raises(ValueError, match="episode_next_value.*one entry per episode"):
        credit_on_groups(turn_gae, b, torch.tensor([True]), values=t([0.0] * 3), episode_next_value=t([0.0] * 3),
                         episode_truncated=torch.tensor([False, False]))
    with pytest.raises(ValueError, match="'values'.*one entry per step row"):
        credit_on_groups(turn_gae, b, torch.tensor([True]), values=t([0.0] * 2), episode_next_value=t([0.0] * 2),
                         episode_truncated=torch.tensor([False, False]))
