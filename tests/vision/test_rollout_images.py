"""Images across turns in the rollout: what the model is fed, and the log-prob invariant with images."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from arborl.env.base import StepResult
from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs, train_tokenizer
from arborl.rollout import ModelPolicy, run_episodes
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.media import MemoryMedia, image_inputs
from arborl.rollout.tree import tree_specs
from arborl.train.batch import collate

from .conftest import gen, lake, rollout_config, specs


class ColourEnv:
    """Shows a solid picture of colour ``(40 k, 0, 255 - 40 k)`` in turn k (1-based); never ends by itself."""

    task_type = "colour"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.t = 1
        return self.t, {}

    def step(self, action: str) -> StepResult:
        self.t += 1
        return StepResult(obs=self.t, reward=0.0, info={"action_valid": True, "action": "any"})

    @staticmethod
    def picture(k: int) -> np.ndarray:
        return np.full((16, 16, 3), (40 * k, 0, 255 - 40 * k), dtype=np.uint8)

    def format_observation(self, obs: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "image", "image": self.picture(obs)},
                                             {"type": "text", "text": f"turn {obs}"}]}]

    def state_key(self) -> int:
        return self.t

    def close(self) -> None:
        pass


def _fed_images(model) -> tuple[list[torch.Tensor], Any]:
    fed: list[torch.Tensor] = []
    hook = model.vision.register_forward_hook(lambda mod, args, out: fed.append(args[0].clone()))
    return fed, hook


def _pixels(model, pictures: list[np.ndarray]) -> torch.Tensor:
    from arborl.policy.vision import image_spec

    return image_spec(model).to_pixels(pictures)


def test_turn_three_input_holds_the_images_of_turns_one_to_three_in_order(vision_model, renderer):
    fed, hook = _fed_images(vision_model)
    try:  # without cache reuse every turn feeds the whole conversation: turn 3's input is all of it
        run_episodes(ModelPolicy(vision_model, renderer, reuse_cache=False), ColourEnv, specs(1),
                     rollout_config(max_turns=3), generator=gen(), media=MemoryMedia())
    finally:
        hook.remove()
    assert len(fed) == 3
    expected = _pixels(vision_model, [ColourEnv.picture(k) for k in (1, 2, 3)])
    assert torch.equal(fed[2], expected)  # turn 3: turn 1's, turn 2's and turn 3's picture, in this order
    assert not torch.equal(fed[2], _pixels(vision_model, [ColourEnv.picture(k) for k in (2, 1, 3)]))


def test_with_the_cache_each_turn_feeds_only_its_new_image_and_attends_over_all(vision_model, renderer):
    fed, hook = _fed_images(vision_model)
    media = MemoryMedia()
    try:
        (ep,) = run_episodes(ModelPolicy(vision_model, renderer), ColourEnv, specs(1), rollout_config(max_turns=3),
                             generator=gen(), media=media)
    finally:
        hook.remove()
    assert [torch.equal(f, _pixels(vision_model, [ColourEnv.picture(k)])) for k, f in enumerate(fed, 1)] == [True] * 3
    # the turn-3 log-probs the rollout recorded are those of a fresh forward pass over all three images
    batch = collate([ep], pad_id=renderer.tokenizer.pad_token_id, images=image_inputs(vision_model, media))
    assert torch.equal(batch.pixel_values, _pixels(vision_model, [ColourEnv.picture(k) for k in (1, 2, 3)]))
    with torch.no_grad():
        logp = token_logprobs(vision_model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                              pixel_values=batch.pixel_values)
    assert torch.allclose(logp, batch.old_logp, atol=1e-5)


def _recomputed(model, episodes, media, pad_id, *, images: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate(episodes, pad_id=pad_id, images=image_inputs(model, media))
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                              pixel_values=batch.pixel_values if images else None)
    return logp * batch.loss_mask, batch.old_logp * batch.loss_mask


def test_rollout_logprobs_equal_recomputed_ones_with_images(vision_model, renderer):
    media = MemoryMedia()
    # 7 episodes on 3 slots: rows join and leave the batch, prompt chunks are left-padded together
    eps = run_episodes(ModelPolicy(vision_model, renderer), lambda: lake("first"), specs(7), rollout_config(4, 3),
                       generator=gen(1), media=media)
    assert all(t.media for e in eps for t in e.turns)
    pad = renderer.tokenizer.pad_token_id
    logp, old = _recomputed(vision_model, eps, media, pad)
    assert float((logp - old).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="placeholders"):
        vision_model.embed_inputs(torch.tensor([[1]]), _pixels(vision_model, [ColourEnv.picture(1)]))
    with pytest.raises(ValueError, match="no pixel_values"):  # a forward that forgot the images is refused
        _recomputed(vision_model, eps, media, pad, images=False)
    batch = collate(eps, pad_id=pad, images=image_inputs(vision_model, media))
    with torch.no_grad():  # other pictures, other numbers: the log-probs depend on the images
        other = token_logprobs(vision_model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask,
                               pixel_values=batch.pixel_values.flip(0))
    assert float((other * batch.loss_mask - old).abs().max()) > 1e-4


def test_continuations_feed_their_prefix_images_from_the_kept_row_or_the_store(vision_model, renderer):
    media, kept = MemoryMedia(), PrefixCache()
    policy = ModelPolicy(vision_model, renderer)
    cfg = rollout_config(3, 4)
    trunks = run_episodes(policy, lambda: lake("first"), specs(2, group=2), cfg, generator=gen(2), media=media,
                          prefix_cache=kept)
    conts = tree_specs(trunks, k=1, nodes=3, select="uniform", generator=gen(5))
    assert any(len(s.prefix) >= 2 for s in conts)  # later turns: the prefix holds earlier turns' images
    pad = renderer.tokenizer.pad_token_id
    seeded = run_episodes(policy, lambda: lake("first"), conts, cfg, generator=gen(3), media=media, prefix_cache=kept)
    assert kept.reused_tokens > 0
    logp, old = _recomputed(vision_model, seeded, media, pad)
    assert float((logp - old).abs().max()) < 1e-5
    # without kept rows the prefix is prefilled with its images read back by reference: the same numbers
    fresh = run_episodes(policy, lambda: lake("first"), conts, cfg, generator=gen(3), media=media)
    assert [lp for e in fresh for t in e.turns for lp in t.output_logprobs] == pytest.approx(
        [lp for e in seeded for t in e.turns for lp in t.output_logprobs], abs=1e-5)


def test_dropping_earlier_images_blanks_them_and_changes_only_later_turns(vision_model, renderer):
    fed, hook = _fed_images(vision_model)
    try:
        (dropped,) = run_episodes(ModelPolicy(vision_model, renderer, reuse_cache=False, drop_earlier_images=True),
                                  ColourEnv, specs(1), rollout_config(3, greedy=True), generator=gen(),
                                  media=MemoryMedia())
    finally:
        hook.remove()
    grey = np.full((16, 16, 3), 128, dtype=np.uint8)
    assert torch.equal(fed[2], _pixels(vision_model, [grey, grey, ColourEnv.picture(3)]))
    (kept,) = run_episodes(ModelPolicy(vision_model, renderer), ColourEnv, specs(1), rollout_config(3, greedy=True),
                           generator=gen(), media=MemoryMedia())
    assert dropped.turns[0].output_logprobs == pytest.approx(kept.turns[0].output_logprobs, abs=1e-6)
    assert dropped.turns[2].output_logprobs[0] != pytest.approx(kept.turns[2].output_logprobs[0], abs=1e-6)
    with pytest.raises(ValueError, match="reuse_cache=False"):
        ModelPolicy(vision_model, renderer, drop_earlier_images=True)


def test_a_text_policy_and_a_missing_media_sink_fail_the_episode_with_the_fix():
    tok = train_tokenizer(["turn 1 2 3 Left Right Up Down"], extra_words=["Left", "Right", "Up", "Down"])
    text_model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                         intermediate_size=64), tok, seed=0)
    (ep,) = run_episodes(ModelPolicy(text_model, ChatRenderer(tok)), ColourEnv, specs(1), rollout_config(2),
                         generator=gen(), media=MemoryMedia())
    assert ep.stop_reason == "env_error" and "reads text only" in ep.metadata["error"]


def test_no_media_sink_is_an_error_naming_the_fix(vision_model, renderer):
    (ep,) = run_episodes(ModelPolicy(vision_model, renderer), ColourEnv, specs(1), rollout_config(2), generator=gen())
    assert ep.stop_reason == "env_error" and "pass media=store" in ep.metadata["error"]


def test_a_bf16_rollout_copy_reads_the_images_too(vision_model, renderer):
    """``policy.rollout_dtype = "bfloat16"`` with a vision policy: near the float32 model's log-probs, not equal."""
    import copy

    from arborl.rollout.policy import rollout_model

    trained = copy.deepcopy(vision_model)
    media = MemoryMedia()
    eps = run_episodes(ModelPolicy(rollout_model(trained, "bfloat16"), renderer), lambda: lake("first"), specs(3),
                       rollout_config(4, 3), generator=gen(1), media=media)
    assert all(t.media for e in eps for t in e.turns)
    logp, old = _recomputed(trained, eps, media, renderer.tokenizer.pad_token_id)
    assert 1e-5 < float((logp - old).abs().max()) < 0.02
