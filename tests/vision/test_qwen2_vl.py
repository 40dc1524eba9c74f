"""Stock Qwen2-VL and Qwen2.5-VL checkpoints (tiny, random weights, built here) through arborl's one policy path.

It loads with ``load_policy``, keeps every earlier turn's image in its input across turns (kept KV
cache, 3-D M-RoPE positions), its rollout log-probs equal the trainer's recomputed ones with the
images read back by reference, and a gradient step trains it; other VLM types are refused by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText, LlavaConfig, Qwen2VLImageProcessorPil

from arborl.config import ConfigError
from arborl.policy import ChatRenderer, add_lora, load_policy, save_policy, token_logprobs
from arborl.policy.hf_vision import POLICY_CLASSES, QWEN2_VL_MARKER
from arborl.policy.model import context_length
from arborl.policy.vision import image_spec
from arborl.rollout import ModelPolicy, run_episodes
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.media import MemoryMedia, image_inputs
from arborl.rollout.tree import tree_specs
from arborl.train.batch import collate

from .conftest import gen, lake, rollout_config, save_tiny_qwen2_vl, specs
from .test_rollout_images import ColourEnv


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def ckpt(request, tmp_path_factory):
    return save_tiny_qwen2_vl(tmp_path_factory.mktemp(request.param) / "ckpt", arch=request.param)


@pytest.fixture(scope="module")
def loaded(ckpt):
    return load_policy(ckpt)


@pytest.fixture
def qpolicy(loaded):
    model, tok = loaded
    return ModelPolicy(model, ChatRenderer(tok))


def _stock_inputs(ckpt, tok, pictures: list[np.ndarray]):
    """Input ids with one placeholder run per picture, and the stock processor's patches for them."""
    proc = Qwen2VLImageProcessorPil.from_pretrained(ckpt)
    out = proc(images=pictures, return_tensors="pt")
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids = tok.encode("<|im_start|>user\n", add_special_tokens=False)
    for n in (out["image_grid_thw"].prod(-1) // 4).tolist():
        ids += tok.encode("<|vision_start|>", add_special_tokens=False) + [pad] * n
        ids += tok.encode("<|vision_end|> turn", add_special_tokens=False)
    return torch.tensor([ids]), out


def test_a_stock_checkpoint_loads_through_load_policy_as_the_same_model(ckpt, loaded, tmp_path):
    model, tok = loaded
    stock = AutoModelForImageTextToText.from_pretrained(ckpt, attn_implementation="eager").eval()
    policy_class = POLICY_CLASSES[stock.config.model_type]
    assert type(model) is policy_class and type(stock) is policy_class.stock_class
    assert image_spec(model).marker == QWEN2_VL_MARKER
    assert model.state_dict().keys() == stock.state_dict().keys()
    assert all(torch.equal(v, stock.state_dict()[k]) for k, v in model.state_dict().items())
    pictures = [ColourEnv.picture(1), ColourEnv.picture(2)]
    ids, out = _stock_inputs(ckpt, tok, pictures)
    with torch.no_grad():
        want = stock(input_ids=ids, pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                     mm_token_type_ids=(ids == model.config.image_token_id).int()).logits
        got = model(input_ids=ids, pixel_values=image_spec(model).to_pixels(pictures)).logits
    keep = torch.ones(want.shape[-1], dtype=torch.bool)
    keep[[model.config.image_token_id, model.config.video_token_id]] = False  # arborl pins the placeholders' logits
    assert torch.allclose(got[..., keep], want[..., keep], atol=1e-6)
    assert float(got[..., ~keep].max()) == -1e4
    # written back as a stock checkpoint: stock transformers reads it, with its image processor
    save_policy(model, tok, tmp_path / "again")
    cfg = json.loads((tmp_path / "again" / "config.json").read_text())
    assert cfg["model_type"] == stock.config.model_type and cfg["architectures"] == [type(stock).__name__]
    back = AutoModelForImageTextToText.from_pretrained(tmp_path / "again")
    assert type(back) is type(stock)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    assert (tmp_path / "again" / "preprocessor_config.json").is_file()
    # the context limit lives in the text config of a VLM
    assert context_length(model.config) == model.config.text_config.max_position_embeddings
    assert ModelPolicy(model, ChatRenderer(tok)).max_context_tokens == context_length(model.config)


def _vision_inputs(model) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], object]:
    fed: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(mod, args, kwargs, out):
        fed.append((args[0].clone(), kwargs["grid_thw"].clone()))

    return fed, model.model.visual.register_forward_hook(hook, with_kwargs=True)


def _patches(model, pictures):
    return image_spec(model).patches(image_spec(model).to_pixels(pictures))


def test_turn_three_input_holds_the_images_of_turns_one_to_three_in_order(qpolicy, loaded):
    model, _ = loaded
    nocache = ModelPolicy(model, qpolicy.renderer, reuse_cache=False)
    fed, hook = _vision_inputs(model)
    try:
        (ep,) = run_episodes(nocache, ColourEnv, specs(1), rollout_config(max_turns=3), generator=gen(),
                             media=MemoryMedia())
    finally:
        hook.remove()
    assert len(fed) == 3 and len(ep.turns) == 3
    want, grid = _patches(model, [ColourEnv.picture(k) for k in (1, 2, 3)])
    assert torch.equal(fed[2][0], want) and torch.equal(fed[2][1], grid)  # turn 3: pictures 1, 2, 3 in order
    assert not torch.equal(fed[2][0], _patches(model, [ColourEnv.picture(k) for k in (2, 1, 3)])[0])
    # each prompt holds one placeholder run of 4 (16 x 16 pixels = 4 x 4 patches, merged 2 x 2)
    pad = model.config.image_token_id
    assert [sum(t == pad for t in turn.prompt_ids) for turn in ep.turns] == [4, 4, 4]


def test_with_the_kept_cache_each_turn_feeds_its_new_image_and_logprobs_match_a_fresh_forward(qpolicy, loaded):
    model, tok = loaded
    media = MemoryMedia()
    fed, hook = _vision_inputs(model)
    try:
        (ep,) = run_episodes(qpolicy, ColourEnv, specs(1), rollout_config(max_turns=3), generator=gen(), media=media)
    finally:
        hook.remove()
    assert [torch.equal(f[0], _patches(model, [ColourEnv.picture(k)])[0]) for k, f in enumerate(fed, 1)] == [True] * 3
    batch = collate([ep], pad_id=tok.pad_token_id, images=image_inputs(model, media))
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                              pixel_values=batch.pixel_values)
    assert float(batch.loss_mask.sum()) > 3
    assert torch.allclose(logp, batch.old_logp, atol=1e-5)


def _recomputed(model, episodes, media, pad_id, pixel_values=None):
    batch = collate(episodes, pad_id=pad_id, images=image_inputs(model, media))
    pixels = batch.pixel_values if pixel_values is None else pixel_values(batch.pixel_values)
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                              pixel_values=pixels)
    return logp * batch.loss_mask, batch.old_logp * batch.loss_mask


def test_rollout_logprobs_equal_recomputed_ones_with_images(qpolicy, loaded):
    model, tok = loaded
    media = MemoryMedia()
    # 7 episodes on 3 slots: rows join and leave, left-padded chunks, cache compaction, 3-D positions per row
    eps = run_episodes(qpolicy, lambda: lake("first"), specs(7), rollout_config(4, 3), generator=gen(1), media=media)
    assert sum(len(e.turns) for e in eps) > 7 and all(t.media for e in eps for t in e.turns)
    logp, old = _recomputed(model, eps, media, tok.pad_token_id)
    assert float((logp - old).abs().max()) < 1e-5
    # other pictures give other numbers: the log-probs do depend on the images
    other, _ = _recomputed(model, eps, media, tok.pad_token_id, pixel_values=lambda p: p.flip(0))
    assert float((other - old).abs().max()) > 1e-4
    with pytest.raises(ValueError, match="no pixel_values"):
        _recomputed(model, eps, media, tok.pad_token_id, pixel_values=lambda p: None)


def test_continuations_from_kept_rows_continue_the_mrope_positions(qpolicy, loaded):
    model, tok = loaded
    media, kept = MemoryMedia(), PrefixCache()
    cfg = rollout_config(3, 4)
    trunks = run_episodes(qpolicy, lambda: lake("first"), specs(2, group=2), cfg, generator=gen(2), media=media,
                          prefix_cache=kept)
    conts = tree_specs(trunks, k=1, nodes=3, select="uniform", generator=gen(5))
    assert any(len(s.prefix) >= 2 for s in conts)
    seeded = run_episodes(qpolicy, lambda: lake("first"), conts, cfg, generator=gen(3), media=media, prefix_cache=kept)
    assert kept.reused_tokens > 0
    logp, old = _recomputed(model, seeded, media, tok.pad_token_id)
    assert float((logp - old).abs().max()) < 1e-5


def test_a_gradient_step_changes_the_weights_and_masked_tokens_get_no_gradient(ckpt, loaded):
    model, tok = load_policy(ckpt)  # a copy of its own: this test changes the weights
    media = MemoryMedia()
    eps = run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: lake("first"), specs(3), rollout_config(3, 3),
                       generator=gen(4), media=media)
    batch = collate(eps, pad_id=tok.pad_token_id, images=image_inputs(model, media))
    logits: list[torch.Tensor] = []

    def keep(mod, args, out):
        out.retain_grad()
        logits.append(out)

    hook = model.lm_head.register_forward_hook(keep)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    try:
        logp = token_logprobs(model.train(), batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                              pixel_values=batch.pixel_values)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()
    finally:
        hook.remove()
    grad = logits[0].grad  # (B, T, V): logits at t predict token t + 1
    predicts_trained = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    predicts_trained[:, :-1] = batch.loss_mask[:, 1:].bool()
    assert float(grad[~predicts_trained].abs().max()) == 0.0  # prompt, image and pad positions: no gradient
    assert float(grad[predicts_trained].abs().sum(-1).min()) > 0.0
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0  # the images are trained through
    opt.step()
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert any("visual" in k for k in changed) and any("language_model" in k for k in changed)


def test_an_unsupported_vlm_checkpoint_type_is_a_config_error_naming_the_supported_ones(tmp_path):
    LlavaConfig().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"'llava' vision-language model.*supported: qwen2_vl, qwen2_5_vl"):
        load_policy(tmp_path)


def test_a_lora_adapter_on_it_keeps_the_logprob_invariant(ckpt):
    model, tok = load_policy(ckpt)
    model = add_lora(model, rank=4)
    with torch.no_grad():  # a non-zero adapter, so it changes the numbers it must reproduce
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1, generator=gen(6))
    assert image_spec(model) is not None  # peft forwards the attribute to the wrapped policy
    media = MemoryMedia()
    eps = run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: lake("first"), specs(3), rollout_config(3, 3),
                       generator=gen(1), media=media)
    logp, old = _recomputed(model, eps, media, tok.pad_token_id)
    assert float((logp - old).abs().max()) < 1e-5


def test_the_rollout_positions_of_a_chunk_are_qwen2_vl_s_own_for_wide_images_and_offsets(loaded):
    model, tok = loaded
    spec = image_spec(model)
    wide, tall = np.zeros((16, 32, 3), np.uint8), np.zeros((32, 16, 3), np.uint8)
    assert [spec.grid(wide), spec.grid(tall)] == [(2, 4), (4, 2)]  # rows, columns: a 16 x 32 picture is 2 x 4
    pad, start, end = tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>"])
    ids = [7, start, *[pad] * 8, end, 8, 9, start, *[pad] * 8, end, 10]
    want, _ = model.model.get_rope_index(torch.tensor([ids]), (torch.tensor([ids]) == pad).int(),
                                         torch.tensor([[1, 4, 8], [1, 8, 4]]))  # the processor's patch grids
    got, nxt = spec.positions(ids, [wide, tall], 0)
    assert torch.equal(got, want[:, 0]) and nxt == int(want.max()) + 1
    # a chunk that starts later continues from its row's text position: the same layout, shifted
    later, nxt_later = spec.positions(ids[11:], [tall], int(want[0, 0, 11]))
    assert torch.equal(later, want[:, 0, 11:]) and nxt_later == nxt
    assert spec.count(ids) == 2 and spec.count(ids[:5]) == 1 and spec.placeholders([wide, tall]) == [8, 8]


def test_an_image_processor_that_cuts_other_patches_than_the_tower_reads_is_refused(ckpt, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(bad)
    with pytest.raises(ConfigError, match=r"\(14, 2, 2\) but the vision tower reads \(4, 2, 2\)"):
        load_policy(bad)


@pytest.mark.parametrize("shape", [(16, 16), (100, 37), (480, 640), (2000, 3000)])
def test_placeholders_per_image_are_the_processors_grid_at_released_qwen2_vl_settings(shape):
    from arborl.policy.hf_vision import Qwen2VLImages

    # the released Qwen2-VL processor settings: 14-pixel patches merged 2 x 2, 56 x 56 to 3584 x 3584 pixels
    proc = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                                    max_pixels=14 * 14 * 4 * 16384)
    image = np.zeros((*shape, 3), np.uint8)
    _, rows, cols = proc(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
    spec = Qwen2VLImages(token_id=1, merge=2, processor=proc)
    assert spec.grid(image) == (rows // 2, cols // 2) and spec.placeholders([image]) == [rows * cols // 4]
