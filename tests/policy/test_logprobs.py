"""token_logprobs: hand-computed values, padding invariance, entropy."""

from __future__ import annotations

import pytest
import torch

from arborl.policy import ModelConfig, build_model, token_logprobs, token_logprobs_and_entropy


@pytest.fixture(scope="module")
def model(word_tokenizer):
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                      max_position_embeddings=64)
    return build_model(cfg, word_tokenizer, seed=1)


def test_matches_manual_log_softmax(model):
    ids = torch.tensor([[2, 7, 9, 11, 5]])
    with torch.no_grad():
        logits = model(ids).logits[0]  # (T, V)
        lp, ent = token_logprobs_and_entropy(model, ids, temperature=0.5)
    assert lp[0, 0] == 0 and ent[0, 0] == 0
    for t in range(1, 5):
        ref = torch.log_softmax(logits[t - 1] / 0.5, -1)
        assert lp[0, t].item() == pytest.approx(ref[ids[0, t]].item(), abs=1e-5)
        assert ent[0, t].item() == pytest.approx(-(ref.exp() * ref).sum().item(), abs=1e-5)


def test_left_and_right_padding_give_unpadded_values(model):
    a, b = [2, 7, 9, 11, 5], [2, 8, 5]
    with torch.no_grad():
        ref_a = token_logprobs(model, torch.tensor([a]))[0]
        ref_b = token_logprobs(model, torch.tensor([b]))[0]
        right = token_logprobs(model, torch.tensor([a, b + [0, 0]]), torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]))
        left = token_logprobs(model, torch.tensor([a, [0, 0] + b]), torch.tensor([[1] * 5, [0, 0, 1, 1, 1]]))
    torch.testing.assert_close(right[0], ref_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(right[1, :3], ref_b, atol=1e-5, rtol=0)
    assert right[1, 3:].abs().sum() == 0
    torch.testing.assert_close(left[1, 2:], ref_b, atol=1e-5, rtol=0)
    assert left[1, :3].abs().sum() == 0  # pads and the first real token have no prediction


def test_gradients_flow(model):
    lp = token_logprobs(model, torch.tensor([[2, 7, 9]]))
    lp.sum().backward()
    assert model.get_input_embeddings().weight.grad is not None
    model.zero_grad()


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, torch.tensor([[2, 7]]), temperature=0.0)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        token_logprobs(model, torch.tensor([2, 7]))
