"""Selective log-probs (``positions=``) equal the full path's, on arborl's and other HF models."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, Qwen2Config

from arborl.policy import ModelConfig, build_model, token_logprobs, token_logprobs_and_entropy
from arborl.policy.logprobs import _body_and_head

V = 50


def _arborl(word_tokenizer, tie: bool):
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                      max_position_embeddings=64, tie_word_embeddings=tie)
    return build_model(cfg, word_tokenizer, seed=3)


def _hf(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    elif kind == "qwen2":
        cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=False)
    else:  # gemma2: final logit soft-capping, so logits are not lm_head(hidden)
        cfg = Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                           final_logit_softcapping=5.0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def _batch(vocab: int, seed: int):
    """Random ids, a mix of left/right padding, and random wanted positions (~30 %)."""
    g = torch.Generator().manual_seed(seed)
    b, t = 4, 17
    ids = torch.randint(1, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, -5:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    positions = (torch.rand(b, t, generator=g) < 0.3).float()
    positions[3] = 0.0  # a row with nothing to train
    return ids, mask, positions


@pytest.fixture(params=["arborl-tied", "arborl-untied", "gpt2", "qwen2", "gemma2"])
def model(request, word_tokenizer):
    if request.param.startswith("arborl"):
        return _arborl(word_tokenizer, tie=request.param == "arborl-tied")
    return _hf(request.param)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selective_equals_full(model, seed):
    ids, mask, positions = _batch(model.config.vocab_size, seed)
    with torch.no_grad():
        full_lp, full_ent = token_logprobs_and_entropy(model, ids, mask, temperature=0.7)
        lp, ent = token_logprobs_and_entropy(model, ids, mask, temperature=0.7, positions=positions)
        only_lp = token_logprobs(model, ids, mask, temperature=0.7, positions=positions)
    keep = positions.clone()
    keep[:, 0] = 0
    keep[:, 1:] *= (mask[:, 1:] * mask[:, :-1]).float()
    torch.testing.assert_close(lp, full_lp * keep, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, full_ent * keep, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(only_lp, lp, atol=0, rtol=0)
    assert (lp[keep == 0] == 0).all() and (lp[keep == 1] != 0).all()


def test_selective_gradients_equal_full(model):
    ids, mask, positions = _batch(model.config.vocab_size, 5)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for pos in (None, positions):
        model.zero_grad()
        lp = token_logprobs(model, ids, mask, positions=pos)
        (lp * positions).sum().backward()
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    model.zero_grad()
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_output_layer_sees_only_wanted_rows(word_tokenizer):
    model = _arborl(word_tokenizer, tie=True)
    ids, mask, positions = _batch(model.config.vocab_size, 0)
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    with torch.no_grad():
        token_logprobs(model, ids, mask, positions=positions)
    hook.remove()
    n = int(positions[:, 1:].mul((mask[:, 1:] * mask[:, :-1]).float()).sum())
    assert seen == [(n, model.config.vocab_size)]  # (N, V), never (B, T, V)


def test_soft_capped_model_takes_the_full_path():
    assert _body_and_head(_hf("gemma2")) is None
    assert _body_and_head(_hf("gpt2")) is not None


def test_entropy_is_a_detached_diagnostic_unless_asked(word_tokenizer):
    model = _arborl(word_tokenizer, tie=True)
    ids, mask, positions = _batch(model.config.vocab_size, 1)
    for pos in (None, positions):
        lp, ent = token_logprobs_and_entropy(model, ids, mask, positions=pos, entropy_grad=False)
        assert lp.requires_grad and not ent.requires_grad
        lp, ent = token_logprobs_and_entropy(model, ids, mask, positions=pos)
        assert ent.requires_grad


def test_positions_shape_is_checked(word_tokenizer):
    model = _arborl(word_tokenizer, tie=True)
    with pytest.raises(ValueError, match="positions shape"):
        token_logprobs(model, torch.tensor([[2, 7, 9]]), positions=torch.ones(1, 2))


@pytest.mark.parametrize("kind", ["arborl", "qwen2"])
def test_last_layer_runs_only_where_a_logit_is_read(kind, word_tokenizer):
    """Llama/Qwen2: the last layer's MLP sees each row's wanted predecessors (padded to the row with most)."""
    model = _arborl(word_tokenizer, tie=True) if kind == "arborl" else _hf("qwen2")
    ids, mask, positions = _batch(model.config.vocab_size, 0)
    seen = {}
    layers = model.model.layers
    hooks = [layers[i].mlp.register_forward_hook(lambda m, i, o, k=i: seen.update({k: tuple(o.shape)}))
             for i in (0, len(layers) - 1)]
    with torch.no_grad():
        token_logprobs(model, ids, mask, positions=positions)
    for h in hooks:
        h.remove()
    keep = positions.clone()
    keep[:, 0] = 0
    keep[:, 1:] *= (mask[:, 1:] * mask[:, :-1]).float()
    b, t = ids.shape
    assert seen[0][:2] == (b, t)  # every column: later columns attend to its keys and values
    assert seen[len(layers) - 1][:2] == (b, int(keep.sum(1).max())) and seen[len(layers) - 1][1] < t


def test_many_wanted_columns_take_the_whole_last_layer(word_tokenizer):
    model = _arborl(word_tokenizer, tie=True)
    ids, mask, _ = _batch(model.config.vocab_size, 0)
    positions = torch.ones_like(ids, dtype=torch.float)  # SFT on every token: the tail would not pay
    shapes = []
    hook = model.model.layers[-1].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, positions=positions)
        full = token_logprobs(model, ids, mask)
    hook.remove()
    assert shapes[0][:2] == tuple(ids.shape)
    torch.testing.assert_close(lp, full * positions * torch.nn.functional.pad(mask[:, 1:] * mask[:, :-1], (1, 0)),
                               atol=0, rtol=0)
