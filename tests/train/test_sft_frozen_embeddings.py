"""policy.frozen_embeddings: fixed random word embeddings, drawn at build and never trained by SFT or RL."""

from __future__ import annotations

import pytest
import torch

from arborl.config import ConfigError
from arborl.loss import sft_loss
from arborl.policy import ModelConfig, build_model, token_logprobs, train_tokenizer
from arborl.train.config import PolicySpec
from arborl.train.embeddings import freeze_embeddings, redraw_embeddings


def _model():
    tok = train_tokenizer(["who is the ceo of nithbrel labs ?", "<answer> mateo </answer>"])
    cfg = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                      max_position_embeddings=32)
    return build_model(cfg, tok, seed=0)


def test_redraw_has_the_asked_std_is_seeded_and_stays_tied():
    a, b = _model(), _model()
    redraw_embeddings(a, 0.125, seed=3)
    redraw_embeddings(b, 0.125, seed=3)
    w = a.get_input_embeddings().weight
    assert w.std().item() == pytest.approx(0.125, rel=0.1)
    assert torch.equal(w, b.get_input_embeddings().weight)
    assert a.get_output_embeddings().weight is w  # the output layer scores against the same vectors


def test_frozen_embeddings_do_not_move_while_the_body_trains():
    model = _model()
    redraw_embeddings(model, 0.125, seed=0)
    before = model.get_input_embeddings().weight.detach().clone()
    body_before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    params = freeze_embeddings(model, 0.125)
    assert all(p is not model.get_input_embeddings().weight for p in params)
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    ids = torch.randint(0, model.config.vocab_size, (4, 10))
    mask = torch.ones(4, 10)
    for _ in range(3):
        opt.zero_grad()
        sft_loss(token_logprobs(model, ids, positions=mask), mask).loss.backward()
        opt.step()
    assert torch.equal(model.get_input_embeddings().weight, before)
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, body_before)


def test_off_trains_everything():
    model = _model()
    assert len(freeze_embeddings(model, 0.0)) == len(list(model.parameters()))


def test_a_negative_std_is_refused():
    with pytest.raises(ConfigError, match="policy.frozen_embeddings"):
        PolicySpec(frozen_embeddings=-0.1)
