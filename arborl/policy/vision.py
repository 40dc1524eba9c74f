"""A small vision-language policy: a patch encoder whose outputs replace the image placeholders of a Llama LM.

:class:`PatchVLMForCausalLM` is :class:`~transformers.LlamaForCausalLM` plus a
:class:`PatchEncoder` (one strided convolution: each ``patch_size`` x ``patch_size`` patch of the
image becomes one embedding, plus a learned per-patch position embedding and a two-layer MLP,
as in ViT's patch embedding without the transformer). An image in the input is a run of
``tokens_per_image`` ``<image>`` placeholder tokens; :meth:`PatchVLMForCausalLM.embed_inputs`
replaces their embeddings, in order, by the patch features of ``pixel_values`` (LLaVA's scheme,
with the vision tower reduced to a patch embedding). The rollout's prefill and the trainer's
forward pass both call the model with ``pixel_values``, so they embed the same inputs the same way.

The placeholder token is never sampled: its logit is set to ``-1e4`` (exp underflows to 0 in
float32, and entropies stay finite), in the forward that the rollout and the trainer share.

Checkpoints are Hugging Face checkpoints (``config.json`` with ``model_type =
"arborl_patch_vlm"``, ``model.safetensors``); importing :mod:`arborl.policy` registers the
classes with ``AutoConfig`` and ``AutoModelForCausalLM``, so :func:`arborl.policy.load_policy`
(and plain ``AutoModelForCausalLM.from_pretrained`` after that import) read them back.

Stock Hugging Face VLM checkpoints (Qwen2-VL) load through the same ``load_policy`` and read
images through the same :class:`ImageReader` interface (:mod:`arborl.policy.hf_vision`). The
FrozenLake maps are 16 x 16 pixels: one patch per cell needs no vision transformer, hence this
smaller policy for training from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from tokenizers import AddedToken
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

IMAGE_MARKER = "<image>"
"""Text an observation's image part becomes; the tokenizer holds it as one special token."""
MASKED_LOGIT = -1e4
"""Logit of the placeholder token (never sampled, and log-softmax stays finite)."""


class PatchVLMConfig(LlamaConfig):
    """A Llama config plus the image shape the patch encoder reads.

    Args:
        image_size: Side of the (square) input image in pixels.
        patch_size: Side of a patch; ``(image_size / patch_size) ** 2`` placeholders per image.
        num_channels: Colour channels (3: RGB).
        image_token_id: Id of the ``<image>`` placeholder token.
        **kwargs: The language model's :class:`~transformers.LlamaConfig` fields.
    """

    model_type = "arborl_patch_vlm"

    def __init__(self, image_size: int = 16, patch_size: int = 4, num_channels: int = 3,
                 image_token_id: int | None = None, **kwargs: Any) -> None:
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels
        self.image_token_id = image_token_id
        super().__init__(**kwargs)

    @property
    def tokens_per_image(self) -> int:
        """Placeholders (patches) per image."""
        return (self.image_size // self.patch_size) ** 2


class PatchEncoder(nn.Module):
    """``(N, C, S, S)`` pixels -> ``(N, P, H)`` patch features (P = (S / patch)^2, row-major patches)."""

    def __init__(self, cfg: PatchVLMConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.patch = nn.Conv2d(cfg.num_channels, h, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position = nn.Parameter(torch.zeros(cfg.tokens_per_image, h))
        self.mlp = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, h))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch features ``(N, P, H)`` of ``(N, C, S, S)`` pixels."""
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)  # (N, P, H)
        return self.mlp(x + self.position)


class PatchVLMForCausalLM(LlamaForCausalLM):
    """A Llama causal LM that reads images through :class:`PatchEncoder` features at ``<image>`` placeholders."""

    config_class = PatchVLMConfig

    def __init__(self, config: PatchVLMConfig) -> None:
        super().__init__(config)
        self.vision = PatchEncoder(config)
        self.post_init()

    def image_spec(self) -> ImageSpec | None:
        """How this policy reads images (``None`` when its config names no placeholder token)."""
        cfg = self.config
        return None if cfg.image_token_id is None else ImageSpec(cfg.image_token_id, cfg.tokens_per_image, cfg.image_size)

    def embed_inputs(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        """Token embeddings of ``input_ids`` with the placeholders replaced, in order, by the images' patch features.

        Raises:
            ValueError: the number of placeholders is not ``images * tokens_per_image``.
        """
        embeds = self.get_input_embeddings()(input_ids)  # (B, T, H)
        feats = self.vision(pixel_values.to(embeds.dtype))  # (N, P, H)
        slots = input_ids == self.config.image_token_id  # (B, T)
        if int(slots.sum()) != feats.shape[0] * feats.shape[1]:
            raise ValueError(f"the input has {int(slots.sum())} image placeholders but {feats.shape[0]} images of "
                             f"{feats.shape[1]} patches; every image needs exactly one run of placeholders")
        # masked_scatter fills the placeholders in row-major order: image k's patches at its k-th run
        return embeds.masked_scatter(slots[..., None].expand_as(embeds), feats.reshape(-1, feats.shape[-1]))

    def forward(self, input_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """:class:`LlamaForCausalLM`'s forward; with ``pixel_values`` the placeholders carry the images.

        Raises:
            ValueError: ``input_ids`` hold placeholders and no ``pixel_values`` came with them (a
                forward pass that silently read images as plain tokens would train on other inputs).
        """
        img = self.config.image_token_id
        if pixel_values is not None:
            inputs_embeds, input_ids = self.embed_inputs(input_ids, pixel_values), None
        elif input_ids is not None and img is not None and bool((input_ids == img).any()):
            raise ValueError("the input has image placeholders but no pixel_values; pass the images "
                             "(training: collate(..., images=arborl.rollout.media.image_inputs(model, store)))")
        out = super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds, **kwargs)
        if img is not None and out.logits is not None:
            hide = torch.zeros(out.logits.shape[-1], dtype=torch.bool, device=out.logits.device)
            hide[img] = True
            out.logits = out.logits.masked_fill(hide, MASKED_LOGIT)
        return out


AutoConfig.register(PatchVLMConfig.model_type, PatchVLMConfig, exist_ok=True)
AutoModelForCausalLM.register(PatchVLMConfig, PatchVLMForCausalLM, exist_ok=True)


class ImageReader(Protocol):
    """How a vision policy reads images; the rollout (:mod:`arborl.rollout.media`) and the trainer use only this.

    Implemented by :class:`ImageSpec` (:class:`PatchVLMForCausalLM`) and by
    :class:`arborl.policy.hf_vision.Qwen2VLImages` (stock Qwen2-VL checkpoints).
    """

    token_id: int
    """The placeholder token id (one run of it per image)."""
    marker: str
    """Text an image part of an observation becomes before the chat template renders it."""
    multimodal_rope: bool
    """Whether the model's rotary positions are 3-D (M-RoPE): the reader is then a :class:`MultimodalRopeReader`."""

    def placeholders(self, images: list[np.ndarray]) -> list[int]:
        """How many placeholder tokens each image takes."""
        ...

    def count(self, ids: list[int]) -> int:
        """How many images the placeholder runs in ``ids`` stand for."""
        ...

    def to_pixels(self, images: list[np.ndarray]) -> torch.Tensor:
        """Canonical images -> the ``pixel_values`` the model's forward takes, ``(N, ...)``."""
        ...


class MultimodalRopeReader(ImageReader, Protocol):
    """An :class:`ImageReader` with ``multimodal_rope = True``: the model's positions are 3-D (M-RoPE)."""

    def positions(self, ids: list[int], images: list[np.ndarray], start: int) -> tuple[torch.Tensor, int]:
        """``(3, len(ids))`` rotary positions of ``ids`` (holding ``images``) from text position ``start``, and the next text position."""
        ...


@dataclass(frozen=True)
class ImageSpec:
    """How :class:`PatchVLMForCausalLM` reads images: its placeholder token, how many per image, its pixel preprocessing."""

    token_id: int
    tokens_per_image: int
    image_size: int
    marker: str = IMAGE_MARKER
    multimodal_rope: bool = False
    """1-D rotary positions: the rollout counts real tokens."""

    def placeholders(self, images: list[np.ndarray]) -> list[int]:
        """``tokens_per_image`` for every image."""
        return [self.tokens_per_image] * len(images)

    def count(self, ids: list[int]) -> int:
        """Placeholders in ``ids`` divided by ``tokens_per_image`` (runs of adjacent images are not delimited)."""
        return sum(1 for t in ids if t == self.token_id) // self.tokens_per_image

    def to_pixels(self, images: list[np.ndarray]) -> torch.Tensor:
        """Canonical ``(H, W, 3)`` uint8 images -> ``(N, 3, S, S)`` float pixels in [-1, 1].

        Raises:
            ValueError: an image is not ``image_size`` x ``image_size``.
        """
        for im in images:
            if im.shape[:2] != (self.image_size, self.image_size):
                raise ValueError(f"an observation image is {im.shape[1]}x{im.shape[0]} pixels; this policy reads "
                                 f"{self.image_size}x{self.image_size} (policy.model.image_size)")
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()  # (N, 3, S, S)
        return x / 127.5 - 1.0


def image_spec(model: Any) -> ImageReader | None:
    """How a vision policy reads images (its ``image_spec()``); ``None`` for a text-only model.

    A LoRA (peft) model forwards the attribute to the model it wraps.
    """
    reader = getattr(model, "image_spec", None)
    return reader() if callable(reader) else None


def add_image_token(tokenizer: Any) -> int:
    """Add the ``<image>`` placeholder to ``tokenizer`` as a special token (if missing); its id."""
    if IMAGE_MARKER not in tokenizer.get_vocab():
        tokenizer.add_tokens([AddedToken(IMAGE_MARKER, special=True, normalized=False)], special_tokens=True)
    return int(tokenizer.convert_tokens_to_ids(IMAGE_MARKER))


def vision_config(common: dict[str, Any], *, image_size: int, patch_size: int, image_token_id: int) -> PatchVLMConfig:
    """The :class:`PatchVLMConfig` of a from-scratch policy (``common``: the Llama fields).

    Raises:
        ValueError: ``patch_size`` does not divide ``image_size``.
    """
    if image_size % patch_size:
        raise ValueError(f"policy.model.patch_size ({patch_size}) does not divide image_size ({image_size}); "
                         "pick a divisor (4 gives one patch per FrozenLake cell)")
    return PatchVLMConfig(image_size=image_size, patch_size=patch_size, image_token_id=image_token_id, **common)
