"""Gradient checkpointing and bf16 autocast of the training forward: same gradients / close numbers, less memory."""

from __future__ import annotations

import copy

import pytest
import torch

from arborl.policy import ModelConfig, build_model
from arborl.policy.model import set_training_options

TINY = ModelConfig(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=128)
IDS = torch.randint(6, 12, (2, 24), generator=torch.Generator().manual_seed(0))  # the word tokenizer has > 12 ids


def _model(word_tokenizer, **options):
    return set_training_options(build_model(TINY, word_tokenizer, seed=0), **options)


def _grads_and_saved_bytes(model):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.log_softmax(model(input_ids=IDS, use_cache=False).logits.float(), -1)[..., 7].mean()
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)


def test_checkpointing_gives_the_same_gradients_keeping_fewer_activations(word_tokenizer):
    plain_grads, plain_bytes = _grads_and_saved_bytes(_model(word_tokenizer))
    ckpt_grads, ckpt_bytes = _grads_and_saved_bytes(_model(word_tokenizer, gradient_checkpointing=True))
    for name, g in plain_grads.items():
        assert torch.allclose(ckpt_grads[name], g, atol=1e-6), name
    assert ckpt_bytes < plain_bytes / 2, (ckpt_bytes, plain_bytes)


@pytest.mark.parametrize("options", [{"gradient_checkpointing": True}, {"autocast": "bf16"}])
def test_forwards_without_gradients_are_unchanged(word_tokenizer, options):
    plain, changed = _model(word_tokenizer), _model(word_tokenizer, **options)
    with torch.inference_mode():
        assert torch.equal(changed(input_ids=IDS).logits, plain(input_ids=IDS).logits)


def test_bf16_autocast_runs_the_training_forward_in_bfloat16_close_to_float32(word_tokenizer):
    plain, bf16 = _model(word_tokenizer), _model(word_tokenizer, autocast="bf16")
    a, b = plain(input_ids=IDS, use_cache=False).logits, bf16(input_ids=IDS, use_cache=False).logits
    assert b.dtype == torch.bfloat16 and a.dtype == torch.float32
    lp_a, lp_b = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
    assert 0 < (lp_a - lp_b).abs().max().item() < 0.05
    b.float().mean().backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in bf16.parameters())


def test_a_deep_copy_computes_with_its_own_weights(word_tokenizer):
    model = _model(word_tokenizer, gradient_checkpointing=True, autocast="bf16")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    before = model(input_ids=IDS, use_cache=False).logits
    assert not torch.equal(twin(input_ids=IDS, use_cache=False).logits, before)
    assert torch.equal(model(input_ids=IDS, use_cache=False).logits, before)
    # with a cache (never in training) the layers run plainly: no key written twice
    assert model(input_ids=IDS, use_cache=True).logits.shape == before.shape


def test_an_unknown_autocast_is_refused(word_tokenizer):
    with pytest.raises(ValueError, match="'none' or 'bf16'"):
        _model(word_tokenizer, autocast="fp8")
