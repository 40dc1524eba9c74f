"""sample_next and the rollout configs: hand-computed top-p sets, logprob convention, validation."""

from __future__ import annotations

import math

import pytest
import torch

from arborl.rollout import EpisodeSpec, RolloutConfig, SamplingConfig, sample_next
from arborl.rollout.sampling import _top_p_filter


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    logp = torch.log_softmax(_logits([0.05, 0.5, 0.15, 0.3]), -1)
    kept = lambda p: torch.isfinite(_top_p_filter(logp, p))[0].tolist()  # noqa: E731
    assert kept(0.75) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.75
    assert kept(0.85) == [False, True, True, True]  # 0.5 + 0.3 + 0.15 reaches 0.85
    assert kept(0.45) == [False, True, False, False]
    assert kept(0.1) == [False, True, False, False]  # the top token always stays
    assert kept(1.0) == [True, True, True, True]


def test_greedy_takes_argmax_and_records_temperature_one_logprob():
    logits = _logits([0.1, 0.6, 0.3]).repeat(2, 1)
    cfg = SamplingConfig(greedy=True, temperature=0.5)
    tok, lp = sample_next(logits, cfg, torch.Generator().manual_seed(0))
    assert tok.tolist() == [1, 1]
    assert lp.tolist() == pytest.approx([math.log(0.6)] * 2, abs=1e-6)


def test_sampled_logprob_is_full_softmax_at_temperature():
    logits = _logits([0.1, 0.6, 0.3])
    # Tempered probs are ~[0.19, 0.47, 0.33]: top-p 0.4 (applied after the temperature) keeps token 1.
    cfg = SamplingConfig(temperature=2.0, top_p=0.4)
    tok, lp = sample_next(logits.repeat(50, 1), cfg, torch.Generator().manual_seed(0))
    assert set(tok.tolist()) == {1}
    expected = torch.log_softmax(logits / 2.0, -1)[0, 1].item()  # full distribution, not truncated
    assert lp[0].item() == pytest.approx(expected, abs=1e-6)


def test_sampling_frequencies_follow_the_tempered_distribution():
    probs = torch.tensor([0.2, 0.5, 0.3])
    n = 20000
    tok, _ = sample_next(probs.log().repeat(n, 1), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(3))
    freq = torch.bincount(tok, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.015)
    # Temperature 0.5 squares and renormalises the probabilities.
    tok, _ = sample_next(probs.log().repeat(n, 1), SamplingConfig(temperature=0.5), torch.Generator().manual_seed(3))
    sq = probs**2 / (probs**2).sum()
    assert torch.allclose(torch.bincount(tok, minlength=3).float() / n, sq, atol=0.015)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
     ({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": float("nan")}, "temperature")],
)
def test_sampling_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"max_turns": 0}, "max_turns"), ({"batch_size": 0}, "batch_size"), ({"invalid_action_penalty": 0.5}, "penalty"),
     ({"max_context_tokens": 16, "sampling": SamplingConfig(max_new_tokens=16)}, "max_context_tokens")],
)
def test_rollout_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RolloutConfig(**kwargs)


def test_logprob_temperature_and_spec_defaults():
    assert SamplingConfig(temperature=0.7).logprob_temperature == 0.7
    assert SamplingConfig(temperature=0.7, greedy=True).logprob_temperature == 1.0
    assert EpisodeSpec("t", "count", "g", seed=3).options is None
