"""LMSession used directly: slot bookkeeping errors, and ModelPolicy construction rules."""

from __future__ import annotations

import pytest
import torch

from arborl.rollout import LMSession, ModelPolicy, SamplingConfig, TurnRequest


def _session(model, renderer) -> LMSession:
    return LMSession(model, end_token_ids=renderer.end_token_ids, pad_token_id=0,
                     sampling=SamplingConfig(greedy=True, max_new_tokens=3), generator=torch.Generator())


def test_slots_must_be_released_before_they_stop_generating(model, renderer):
    s = _session(model, renderer)
    prompt = renderer.first_prompt("step 0 of board")
    outs = s.generate([TurnRequest(0, prompt, 3), TurnRequest(1, prompt, 2)])
    assert len(outs[0].ids) <= 4 and len(outs[1].ids) <= 3
    # Same prompt, same greedy tokens, whatever the budget (up to the cut).
    assert outs[1].ids[:2] == outs[0].ids[:2]
    nxt = renderer.next_prompt("step 1 of board")
    with pytest.raises(ValueError, match="release"):
        s.generate([TurnRequest(0, nxt, 3)])
    s.release(1)
    (out,) = s.generate([TurnRequest(0, nxt, 3)])
    assert out.ids and out.ids[-1] in renderer.end_token_ids
    with pytest.raises(ValueError, match="same slot"):
        s.generate([TurnRequest(0, nxt, 3), TurnRequest(0, nxt, 3)])


def test_model_policy_builds_its_renderer_from_a_tokenizer(model, tokenizer, renderer):
    policy = ModelPolicy(model, tokenizer, system_prompt="you are an agent")
    assert policy.renderer.first_prompt("step")[:5] == tokenizer.convert_tokens_to_ids(
        ["<|system|>", "you", "are", "an", "agent"]
    )
    assert policy.max_context_tokens == model.config.max_position_embeddings
    with pytest.raises(ValueError, match="system_prompt"):
        ModelPolicy(model, renderer, system_prompt="twice")


def test_num_threads_applies_during_generation_only(model, renderer, monkeypatch):
    seen = []
    # the output projection: every forward pass calls it, the engine's own (decoder.py) and HF's
    real_forward = model.lm_head.forward

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model.lm_head, "forward", spy)
    torch.set_num_threads(2)
    session = ModelPolicy(model, renderer, num_threads=1).open_session(
        SamplingConfig(greedy=True, max_new_tokens=2), torch.Generator()
    )
    session.generate([TurnRequest(0, renderer.first_prompt("step 0 of board"), 2)])
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="num_threads"):
        ModelPolicy(model, renderer, num_threads=0)
