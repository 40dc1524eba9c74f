"""The process-reward estimator: hand-computed vectors, edge cases, and vectorised == reference loop."""

import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arborl.credit import StepBatch, credit_on_groups, gigpo, grpo, process, process_step_advantages
from arborl.credit import reference as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "credit"))
from test_menu import agree, step_batches  # noqa: E402


def two_episode_group(**kw):
    # one group: episode 0 (2 steps, succeeded), episode 1 (1 step, failed); rows interleaved
    return StepBatch(episode=torch.tensor([0, 1, 0]), step=torch.tensor([0, 0, 1]), reward=torch.zeros(3),
                     anchor=torch.tensor([0, 0, 1]), group=torch.tensor([0, 0]), score=torch.tensor([1.0, 0.0]), **kw)


SCORES = torch.tensor([0.2, 0.4, 0.8])  # rows: ep0 step0, ep1 step0, ep0 step1


def close(a, b, tol=1e-5):
    return torch.allclose(a, torch.tensor(b, dtype=torch.float32), atol=tol)


def test_mean_norm_gamma_0_adds_each_score_minus_the_group_mean():
    # A^E = R - mean = +0.5 / -0.5 ; A^P = p - mean(0.2, 0.4, 0.8) = p - 0.4667
    b = two_episode_group()
    a = process(b, step_scores=SCORES, weight=1.0, gamma=0.0, norm_by_std=False)
    assert close(a, [0.5 - 0.26667, -0.5 - 0.06667, 0.5 + 0.33333])


def test_gamma_1_uses_the_process_return_to_go():
    # to-go: ep0 step0 = 0.2 + 0.8 = 1.0, ep0 step1 = 0.8, ep1 step0 = 0.4 ; mean 0.7333
    b = two_episode_group()
    a_p = process_step_advantages(b, SCORES, gamma=1.0, norm_by_std=False)
    assert close(a_p, [0.26667, -0.33333, 0.06667])


def test_std_normalised_and_weighted():
    # A^E = +-(0.5 / 0.70711) ; A^P = (p - 0.46667) / 0.30551 ; w = 0.5
    b = two_episode_group()
    a = process(b, step_scores=SCORES, weight=0.5, gamma=0.0, norm_by_std=True)
    ae, sd = 0.5 / math.sqrt(0.5), math.sqrt(((0.2 - 0.46667) ** 2 + (0.4 - 0.46667) ** 2 + (0.8 - 0.46667) ** 2) / 2)
    assert close(a, [ae + 0.5 * (0.2 - 0.46667) / sd, -ae + 0.5 * (0.4 - 0.46667) / sd, ae + 0.5 * (0.8 - 0.46667) / sd],
                 tol=1e-4)


def test_step_term_on_its_own_scale_while_the_episode_term_is_std_normalised():
    # A^E = +-(0.5 / 0.70711) as above; A^P = p - 0.46667 undivided (its std 0.30551 would stretch it 3.3x)
    b = two_episode_group()
    a = process(b, step_scores=SCORES, weight=1.0, gamma=0.0, norm_by_std=True, step_norm_by_std=False)
    ae = 0.5 / math.sqrt(0.5)
    assert close(a, [ae - 0.26667, -ae - 0.06667, ae + 0.33333], tol=1e-4)
    # small scores stay small: a reward model that barely tells steps apart barely moves the advantage
    tiny = process(b, step_scores=SCORES * 1e-3, norm_by_std=True, step_norm_by_std=False)
    assert torch.allclose(tiny, torch.tensor([ae, -ae, ae]), atol=1e-3)


def test_weight_zero_is_grpo():
    b = two_episode_group()
    assert torch.equal(process(b, step_scores=SCORES, weight=0.0), grpo(b))


def test_anchor_term_adds_gigpo_step_credit_to_the_process_term():
    # one group, two episodes from the same start state 5: ep0 (rewards 0, 1; R = 1), ep1 (reward 0; R = 0)
    # A^E = +-0.5 ; A^P (gamma 0, group baseline) = p - mean(0.2, 0.4, 0.8) ; A^S at state 5: the returns
    # 0.5 * 1 = 0.5 and 0 -> +-0.25; ep0's second step (state 6) is alone in its anchor group -> 0
    b = StepBatch(episode=torch.tensor([0, 1, 0]), step=torch.tensor([0, 0, 1]), reward=torch.tensor([0.0, 0.0, 1.0]),
                  anchor=torch.tensor([5, 5, 6]), group=torch.tensor([0, 0]), score=torch.tensor([1.0, 0.0]))
    kw = dict(step_scores=SCORES, weight=1.0, gamma=0.0, norm_by_std=False)
    a = process(b, anchor_weight=2.0, anchor_gamma=0.5, **kw)
    assert close(a, [0.5 - 0.26667 + 2 * 0.25, -0.5 - 0.06667 - 2 * 0.25, 0.5 + 0.33333])
    # with no process scores to tell steps apart, it is GiGPO with step weight 2
    flat = process(b, step_scores=torch.zeros(3), norm_by_std=False, anchor_weight=2.0, anchor_gamma=0.5)
    assert torch.allclose(flat, gigpo(b, gamma=0.5, step_weight=2.0, norm_by_std=False))
    assert torch.equal(process(b, anchor_weight=0.0, **kw), process(b, **kw))


def test_all_failed_group_still_gets_step_credit_from_the_process_scores():
    # outcome term 0 (std 0) but the PRM tells the steps apart
    b = StepBatch(episode=torch.tensor([0, 1]), step=torch.tensor([0, 0]), reward=torch.zeros(2),
                  anchor=torch.tensor([0, 0]), group=torch.tensor([0, 0]), score=torch.tensor([0.0, 0.0]))
    assert close(process(b, step_scores=torch.tensor([0.1, 0.3]), norm_by_std=False), [-0.1, 0.1])


def test_equal_scores_and_a_lone_step_give_no_step_term():
    b = two_episode_group()
    assert process_step_advantages(b, torch.full((3,), 0.7)).abs().max() == 0
    lone = StepBatch(episode=torch.tensor([0]), step=torch.tensor([0]), reward=torch.zeros(1), anchor=torch.tensor([0]),
                     group=torch.tensor([0]), score=torch.tensor([1.0]))
    # a singleton episode: A^E = R under "raw", 0 under "zero"; its lone step has no peer: A^P = 0
    assert close(process(lone, step_scores=torch.tensor([0.9]), norm_by_std=False), [1.0])
    assert close(process(lone, step_scores=torch.tensor([0.9]), singleton="zero"), [0.0])


def test_inactive_steps_get_nothing_and_their_scores_do_not_count():
    b = two_episode_group(active=torch.tensor([True, True, False]))
    # the active steps are 0.2 and 0.4 (the inactive 0.8 is ignored): mean 0.3
    a_p = process_step_advantages(b, torch.tensor([0.2, 0.4, 100.0]), norm_by_std=False)
    assert close(a_p, [-0.1, 0.1, 0.0])


def test_missing_or_misshapen_scores_are_refused_with_the_fix():
    b = two_episode_group()
    with pytest.raises(ValueError, match="rl.credit"):
        process(b)
    with pytest.raises(ValueError, match="expected 3"):
        process(b, step_scores=torch.zeros(2))


def test_previous_baseline_by_hand():
    # deltas: ep0 step0 0.2 - mean(first steps 0.2, 0.4) = -0.1, ep1 step0 0.4 - 0.3 = +0.1, ep0 step1 0.8 - 0.2 = 0.6
    # then mean-normalised within the group (mean 0.2): -0.3, -0.1, +0.4
    b = two_episode_group()
    a_p = process_step_advantages(b, SCORES, norm_by_std=False, baseline="previous")
    assert close(a_p, [-0.3, -0.1, 0.4])
    with pytest.raises(ValueError, match="baseline"):
        process_step_advantages(b, SCORES, baseline="median")


def test_rloo_baseline_by_hand():
    # episode means: ep0 (0.2 + 0.8) / 2 = 0.5, ep1 0.4; each step minus the other episode's mean:
    # ep0 step0 0.2 - 0.4 = -0.2, ep1 step0 0.4 - 0.5 = -0.1, ep0 step1 0.8 - 0.4 = 0.4
    b = two_episode_group()
    assert close(process_step_advantages(b, SCORES, gamma=0.0, norm_by_std=False, baseline="rloo"),
                 [-0.2 - 0.03333, -0.1 - 0.03333, 0.4 - 0.03333])
    # gamma 1, to-go of the centred scores: 0.2, -0.1, 0.4 ; mean 0.16667
    assert close(process_step_advantages(b, SCORES, gamma=1.0, norm_by_std=False, baseline="rloo"),
                 [0.03333, -0.26667, 0.23333])


def test_rloo_baseline_cancels_a_drift_that_the_return_to_go_turns_into_a_length_bias():
    # every step scores the same 0.3 (a reward model that drifted up): with gamma = 1 the long episode's
    # first step collects the drift three times and looks best; centred, nothing is left to train on
    b = StepBatch(episode=torch.tensor([0, 0, 0, 1]), step=torch.tensor([0, 1, 2, 0]), reward=torch.zeros(4),
                  anchor=torch.tensor([0, 1, 2, 0]), group=torch.tensor([0, 0]), score=torch.tensor([0.0, 0.0]))
    drift = torch.full((4,), 0.3)
    biased = process_step_advantages(b, drift, gamma=1.0, norm_by_std=False, baseline="group")
    assert biased[0] > 0 > biased[3]
    assert process_step_advantages(b, drift, gamma=1.0, baseline="rloo").abs().max() == 0
    # a lone episode is centred on its own mean; an inactive step does not count in any mean
    lone = StepBatch(episode=torch.tensor([0, 0]), step=torch.tensor([0, 1]), reward=torch.zeros(2),
                     anchor=torch.tensor([0, 1]), group=torch.tensor([0]), score=torch.tensor([1.0]))
    assert close(process_step_advantages(lone, torch.tensor([0.1, 0.5]), norm_by_std=False, baseline="rloo"),
                 [-0.2, 0.2])
    b2 = two_episode_group(active=torch.tensor([True, True, False]))
    # ep0's mean is 0.2 (its replayed 100 ignored), ep1's 0.4: centred 0.2 - 0.4, 0.4 - 0.2; mean 0
    assert close(process_step_advantages(b2, torch.tensor([0.2, 0.4, 100.0]), norm_by_std=False, baseline="rloo"),
                 [-0.2, 0.2, 0.0])


@settings(max_examples=150, deadline=None)
@given(step_batches(), st.booleans(), st.booleans(), st.sampled_from(["raw", "zero"]), st.sampled_from([0.0, 0.9, 1.0]),
       st.sampled_from(["group", "previous", "rloo"]), st.sampled_from([None, True, False]), st.sampled_from([0.0, 0.6]),
       st.data())
def test_process_matches_its_reference_loop(b, norm, neutral, singleton, gamma, baseline, step_norm, anchor, data):
    n = b.episode.numel()
    scores = torch.tensor(data.draw(st.lists(st.integers(-100, 100).map(lambda v: v / 50), min_size=n, max_size=n)),
                          dtype=torch.float32)
    kw = dict(step_scores=scores, weight=0.7, gamma=gamma, norm_by_std=norm, length_neutral=neutral,
              singleton=singleton, baseline=baseline, step_norm_by_std=step_norm, anchor_weight=anchor, anchor_gamma=0.9)
    agree(process(b, **kw), ref.process_reference(b, **kw))


def test_float_noise_in_the_scores_is_not_blown_up_into_a_signal():
    # an implicit PRM equal to its reference: log-ratios of ~1e-8 must not become O(1) advantages
    b = two_episode_group()
    noise = torch.tensor([1e-8, -2e-8, 3e-8])
    assert process_step_advantages(b, noise).abs().max() == 0
    assert process_step_advantages(b, noise * 1e4).abs().max() > 0.5  # a real spread still counts


def test_a_filter_hands_the_estimator_the_kept_rows_of_the_model_tensors():
    # groups 0 (episodes 0, 2) and 1 (episode 1); keep group 0 only. [N] tensors follow the steps,
    # [E] tensors (named episode_*) the episodes, and the dropped group's steps get 0
    b = StepBatch(episode=torch.tensor([0, 1, 2, 0]), step=torch.tensor([0, 0, 0, 1]), reward=torch.zeros(4),
                  anchor=torch.zeros(4, dtype=torch.long), group=torch.tensor([0, 1, 0]),
                  score=torch.tensor([1.0, 0.0, 0.0]))
    seen = {}

    def estimator(sub, *, step_scores, episode_bonus):
        seen.update(steps=step_scores.tolist(), bonus=episode_bonus.tolist())
        return step_scores + episode_bonus[sub.episode]

    out = credit_on_groups(estimator, b, torch.tensor([True, False]), step_scores=torch.tensor([0.1, 0.2, 0.3, 0.4]),
                           episode_bonus=torch.tensor([10.0, 20.0, 30.0]))
    assert seen == {"steps": pytest.approx([0.1, 0.3, 0.4]), "bonus": [10.0, 30.0]}
    assert close(out, [10.1, 0.0, 30.3, 10.4])
    # process under the filter = process on the kept groups alone
    scores = torch.tensor([0.1, 0.2, 0.3, 0.4])
    kept = credit_on_groups(process, b, torch.tensor([True, False]), step_scores=scores)
    sub, rows = b.select_episodes(torch.tensor([True, False, True]))
    assert torch.equal(kept[rows], process(sub, step_scores=scores[rows])) and kept[1] == 0
