"""Deterministic CPU stand-ins for the vision tests: a tiny patch-encoder policy and image FrozenLake."""

from __future__ import annotations

import pytest
import torch

from arborl.env.envs import FrozenLakeImage
from arborl.env.envs.frozenlake import ACTIONS
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig
from arborl.rollout.config import SamplingConfig

WORDS = ["turn", *map(str, range(1, 21)), "invalid", "goal", "hole", "solved", "timeout", "ended", *ACTIONS]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([" ".join(WORDS)], extra_words=list(ACTIONS))


@pytest.fixture(scope="module")
def vision_model(tokenizer):
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                      max_position_embeddings=1024, image_size=16, patch_size=4)
    return build_model(cfg, tokenizer, seed=0)


@pytest.fixture(scope="module")
def renderer(tokenizer, vision_model):  # vision_model first: building it adds <image> to the tokenizer
    return ChatRenderer(tokenizer)


@pytest.fixture
def policy(vision_model, renderer):
    return ModelPolicy(vision_model, renderer)


def lake(map_turns: str = "first") -> FrozenLakeImage:
    return FrozenLakeImage(size=4, map_turns=map_turns, max_steps=8)


def specs(n: int, group: int = 1) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"lake-{i}", task_type="lake", group_id=f"g{i}", seed=i)
            for i in range(n) for _ in range(group)]


def rollout_config(max_turns: int = 4, batch_size: int = 4, greedy: bool = False) -> RolloutConfig:
    return RolloutConfig(max_turns=max_turns, batch_size=batch_size,
                         sampling=SamplingConfig(max_new_tokens=3, greedy=greedy))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


QWEN_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""ChatML, as Qwen2-VL's template renders string contents."""


TINY_VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, num_heads=2, hidden_size=32, mlp_ratio=2, in_chans=3),
    # two blocks: one windowed (a window is 16 pixels, 2 x 2 placeholders), one full (fullatt_block_indexes)
    "qwen2_5_vl": dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                       window_size=16, fullatt_block_indexes=[1]),
}
"""The vision tower of each tiny checkpoint; both cut 4-pixel patches and merge them 2 x 2."""


def save_tiny_qwen2_vl(path, *, arch: str = "qwen2_vl", seed: int = 0):
    """A random-weight Qwen2-VL or Qwen2.5-VL (``arch``: 2-layer LM, tiny vision tower) saved the stock way.

    The tokenizer is a byte-level BPE (no merges) with Qwen2-VL's special tokens, the class
    ``AutoTokenizer`` builds for both model types, so the checkpoint reads back as written. A
    16 x 16 picture is a 4 x 4 patch grid, merged 2 x 2 into 4 ``<|image_pad|>`` placeholders.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, Qwen2Tokenizer, Qwen2VLImageProcessorPil
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(sorted(set(bytes_to_unicode().values())))}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|vision_start|>", "<|vision_end|>",
                                                          "<|image_pad|>", "<|video_pad|>"]})
    tok.chat_template = QWEN_CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids
    special = dict(bos_token_id=None, eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"))
    cfg = AutoConfig.for_model(
        arch,
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=True,
                         **special),
        vision_config=dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2, **TINY_VISION[arch]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True, **special)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=64,
                             max_pixels=64 * 64).save_pretrained(path)
    return path
