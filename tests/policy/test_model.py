"""ModelConfig validation, model construction, checkpoint save/load round trips."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arborl.policy import ModelConfig, build_model, load_policy, save_policy

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64, max_position_embeddings=128)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"arch": "gpt2"}, "arch"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 30, "num_heads": 4}, "hidden_size"),
        ({"hidden_size": 24, "num_heads": 8}, "head size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"num_layers": True}, "num_layers"),
    ],
)
def test_model_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(("arch", "tokenizer"), [("llama", "word_tokenizer"), ("qwen2", "chatml_tokenizer")])
def test_build_model_matches_tokenizer_and_is_seeded(request, arch, tokenizer):
    tok = request.getfixturevalue(tokenizer)
    cfg = ModelConfig(arch=arch, **SMALL)
    a = build_model(cfg, tok, seed=3)
    b = build_model(cfg, tok, seed=3)
    c = build_model(cfg, tok, seed=4)
    assert a.config.model_type == arch
    assert a.config.vocab_size == len(tok)
    assert a.get_input_embeddings().weight.data_ptr() == a.get_output_embeddings().weight.data_ptr()
    ids = torch.tensor([[2, 6, 7, 5]])
    assert torch.equal(a(ids).logits, b(ids).logits)
    assert not torch.equal(a(ids).logits, c(ids).logits)


def test_default_model_has_about_two_million_parameters(word_tokenizer):
    model = build_model(ModelConfig(), word_tokenizer, seed=0)
    n = sum(p.numel() for p in model.parameters())
    h, layers, inter, vocab = 256, 2, 688, len(word_tokenizer)
    # tied embedding + per layer (q, k, v, o; gate, up, down; two RMSNorms) + the final norm
    assert n == vocab * h + layers * (4 * h * h + 3 * h * inter + 2 * h) + h
    assert 1.0e6 < n < 2.5e6


def test_build_model_does_not_touch_global_rng(word_tokenizer):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    build_model(ModelConfig(**SMALL), word_tokenizer, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_round_trip_with_plain_auto_classes(tmp_path, word_tokenizer):
    model = build_model(ModelConfig(**SMALL), word_tokenizer, seed=0)
    save_policy(model, word_tokenizer, tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    tok = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    text = "map : F H <answer>up</answer> zebra"
    assert tok.encode(text, add_special_tokens=False) == word_tokenizer.encode(text, add_special_tokens=False)
    assert tok.chat_template == word_tokenizer.chat_template
    ids = torch.tensor([[2, 6, 7, 8, 5, 3]])
    # Plain from_pretrained picks its default attention kernel (sdpa): equal up to float rounding.
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


def test_load_policy_restores_model_and_word_tokenizer(tmp_path, word_tokenizer):
    model = build_model(ModelConfig(**SMALL), word_tokenizer, seed=0)
    save_policy(model, word_tokenizer, tmp_path)
    loaded, tok = load_policy(tmp_path)
    text = "your move ? <answer>left</answer>"
    assert tok.encode(text, add_special_tokens=False) == word_tokenizer.encode(text, add_special_tokens=False)
    assert tok.eos_token_id == word_tokenizer.eos_token_id
    ids = torch.tensor([[2, 9, 10, 5]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert loaded.config._attn_implementation == "eager"


def test_load_policy_keeps_a_chatml_bpe_tokenizer(tmp_path, chatml_tokenizer):
    model = build_model(ModelConfig(arch="qwen2", **SMALL), chatml_tokenizer, seed=0)
    save_policy(model, chatml_tokenizer, tmp_path)
    _, tok = load_policy(tmp_path)
    text = "<|im_start|>user\nmap : F H<|im_end|>\n"
    assert tok.encode(text, add_special_tokens=False) == chatml_tokenizer.encode(text, add_special_tokens=False)


def test_load_policy_errors_name_path_and_fix(tmp_path, word_tokenizer):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_policy(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path)
    model = build_model(ModelConfig(**SMALL), word_tokenizer, seed=0)
    save_policy(model, word_tokenizer, tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        load_policy(tmp_path)


def test_save_policy_requires_a_chat_template(tmp_path, word_tokenizer):
    model = build_model(ModelConfig(**SMALL), word_tokenizer, seed=0)
    tok = word_tokenizer.__class__(tokenizer_object=word_tokenizer.backend_tokenizer, eos_token="<|end|>")
    with pytest.raises(ValueError, match="chat_template"):
        save_policy(model, tok, tmp_path)
