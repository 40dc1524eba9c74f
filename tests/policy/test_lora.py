"""LoRA through peft: the adapter alone is saved, loads back onto its base, and exports merged; devices; Hub ids."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from arborl.policy import (
    ModelConfig,
    add_lora,
    build_model,
    load_policy,
    resolve_device,
    save_adapter,
    save_policy,
)

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
IDS = torch.tensor([[2, 3, 6, 7, 8, 4]])


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture
def base(word_tokenizer, tmp_path):
    model = build_model(TINY, word_tokenizer, seed=0)
    return model, save_policy(model, word_tokenizer, tmp_path / "base")


def _trained_lora(model):
    lora = add_lora(model, rank=4)
    with torch.no_grad():  # as if trained: B away from its zero start
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.5)
    return lora


def test_a_fresh_adapter_changes_nothing_and_only_it_trains(base):
    model, _ = base
    before = _logits(model)
    lora = add_lora(model, rank=4)
    assert torch.equal(_logits(lora), before)  # B = 0 at the start
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].split(".")[-1] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_adapter_saved_alone_loads_onto_its_base_with_the_same_outputs(base, word_tokenizer, tmp_path):
    model, base_dir = base
    lora = _trained_lora(model)
    expected = _logits(lora)
    assert not torch.allclose(expected, _logits(load_policy(base_dir)[0]))
    out = save_adapter(lora, word_tokenizer, tmp_path / "adapter", base=base_dir)
    assert (out / "adapter_config.json").is_file() and not (out / "config.json").exists()
    size = (out / "adapter_model.safetensors").stat().st_size
    assert size < (base_dir / "model.safetensors").stat().st_size / 2  # the adapter, not the weights
    loaded, tok = load_policy(out)
    assert torch.allclose(_logits(loaded), expected, atol=1e-6)
    assert tok.get_vocab() == word_tokenizer.get_vocab()


def test_export_merges_the_adapter_into_a_plain_checkpoint(base, word_tokenizer, tmp_path):
    model, _ = base
    lora = _trained_lora(model)
    expected = _logits(lora)
    out = save_policy(lora, word_tokenizer, tmp_path / "merged")
    assert not (out / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert torch.allclose(_logits(plain), expected, atol=1e-5)
    assert not any("lora" in n for n, _ in plain.named_parameters())
    assert torch.equal(_logits(lora), expected)  # exporting left the training model as it was


def test_device_auto_is_cpu_without_a_gpu_and_bad_names_are_refused():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no GPU"):
            resolve_device("cuda")


def test_a_hub_id_missing_from_the_local_cache_names_the_download(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hf download nobody/no-such-model"):
        load_policy("nobody/no-such-model")
