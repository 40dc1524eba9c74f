"""The vision policy is a Hugging Face checkpoint: save_pretrained / from_pretrained round trip, one load path."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arborl.policy import load_policy, save_policy
from arborl.policy.vision import IMAGE_MARKER, PatchVLMForCausalLM, image_spec


def _inputs(model, tok):
    spec = image_spec(model)
    ids = [tok.convert_tokens_to_ids("turn")] + [spec.token_id] * spec.tokens_per_image + [tok.eos_token_id]
    pixels = torch.linspace(-1, 1, 3 * 16 * 16).reshape(1, 3, 16, 16)
    return torch.tensor([ids]), pixels


def test_save_and_load_give_the_same_model_and_tokenizer(tmp_path, vision_model, tokenizer):
    save_policy(vision_model, tokenizer, tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["model_type"] == "arborl_patch_vlm" and cfg["image_size"] == 16 and cfg["patch_size"] == 4
    model, tok = load_policy(tmp_path / "ckpt")
    assert isinstance(model, PatchVLMForCausalLM)
    assert tok.convert_tokens_to_ids(IMAGE_MARKER) == vision_model.config.image_token_id
    ids, pixels = _inputs(vision_model, tokenizer)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, pixel_values=pixels).logits,
                           vision_model(input_ids=ids, pixel_values=pixels).logits)
    # plain transformers reads the same checkpoint (the classes are registered when arborl.policy is imported)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert type(plain) is PatchVLMForCausalLM
    assert AutoTokenizer.from_pretrained(tmp_path / "ckpt").encode(IMAGE_MARKER, add_special_tokens=False) == [
        vision_model.config.image_token_id]


def test_the_image_changes_the_output_and_the_placeholder_is_never_sampled(vision_model, tokenizer):
    ids, pixels = _inputs(vision_model, tokenizer)
    with torch.no_grad():
        a = vision_model(input_ids=ids, pixel_values=pixels).logits
        b = vision_model(input_ids=ids, pixel_values=-pixels).logits
    assert not torch.allclose(a[0, -1], b[0, -1])
    assert float(a[..., vision_model.config.image_token_id].max()) == -1e4
    assert torch.isfinite(torch.log_softmax(a, -1)).all()
