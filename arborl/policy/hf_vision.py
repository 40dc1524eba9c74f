"""Stock Hugging Face vision-language checkpoints as arborl policies (Qwen2-VL, Qwen2.5-VL).

A local Qwen2-VL checkpoint directory (``config.json`` with ``model_type = "qwen2_vl"``, the
weights, the tokenizer with its chat template, ``preprocessor_config.json``) loads through
:func:`arborl.policy.load_policy` like any policy, as :class:`Qwen2VLPolicy`: the stock
:class:`~transformers.Qwen2VLForConditionalGeneration` (same weights, same ``state_dict``, saved
back as a stock checkpoint) with arborl's calling convention. Qwen2.5-VL (``qwen2_5_vl``: a
windowed-attention vision tower, the same processor and image positions) loads the same way as
:class:`Qwen2_5_VLPolicy`. The convention:

- ``pixel_values`` are canonical pictures, ``(N, 3, H, W)`` floats holding the uint8 values
  (:meth:`Qwen2VLImages.to_pixels`); the forward pass runs the checkpoint's own image processor
  on them (resize to the patch grid, normalise, cut ``patch_size`` patches) and gets the patches
  and ``image_grid_thw`` from it, so the rollout and the trainer, which both hand it the same
  decoded PNG pixels, feed the vision tower the same patches. All images of one forward pass
  must have one size (they are stacked), as for arborl's own patch-encoder policy.
- An image in the text is Qwen2-VL's own ``<|vision_start|><|image_pad|><|vision_end|>``; the
  rollout widens ``<|image_pad|>`` to the image's ``(h / patch / merge) * (w / patch / merge)``
  placeholders (what Qwen2-VL's processor does), whose embeddings the vision features replace.
- Positions are Qwen2-VL's 3-D multimodal rotary positions (M-RoPE: an image's tokens take
  ``(t, row, column)`` positions from where the image starts, and the text after it continues at
  ``start + max(rows, columns)``). Without a cache (the trainer's forward over whole sequences)
  the model computes them itself (``get_rope_index``, as stock transformers does). With a cache
  (the rollout) the caller passes them: :meth:`Qwen2VLImages.positions` computes the same layout
  for a chunk from the row's next text position, which the engine keeps per cache row, so the KV
  cache is kept across turns (no re-prefill) and every earlier turn's image stays in it, in
  order. ``tests/vision/test_qwen2_vl.py`` checks that rollout log-probs equal the trainer's
  recomputed ones, i.e. that the two position computations agree.
- The placeholder tokens (``<|image_pad|>``, ``<|video_pad|>``) get logit ``-1e4``, as in
  :mod:`arborl.policy.vision`: a sampled placeholder would leave the next forward pass with more
  placeholders than images. A trained Qwen2-VL gives them ~0 probability anyway.

Departures from the stock model: videos are not read, and the image processor is the PIL one
(:class:`~transformers.Qwen2VLImageProcessorPil`, no torchvision needed) whatever class the
checkpoint names; its numbers can differ slightly from the torchvision backend's, never between
arborl's rollout and training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    PreTrainedModel,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from arborl.config import ConfigError
from arborl.policy.vision import MASKED_LOGIT

QWEN2_VL_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"
"""What an image part of an observation becomes in the text (Qwen2-VL's chat template writes the same)."""
PREPROCESSOR_FILE = "preprocessor_config.json"


class Qwen2VLImages:
    """How a :class:`Qwen2VLPolicy` reads images (a :class:`~arborl.policy.vision.MultimodalRopeReader`).

    Args:
        token_id: ``<|image_pad|>``'s id.
        merge: ``vision_config.spatial_merge_size`` (patches per placeholder side).
        processor: The checkpoint's image processor (its ``merge_size`` is ``merge``, see :func:`load_vlm`).
    """

    marker = QWEN2_VL_MARKER
    multimodal_rope = True

    def __init__(self, token_id: int, merge: int, processor: Qwen2VLImageProcessorPil) -> None:
        self.token_id, self.merge, self.processor = token_id, merge, processor

    def grid(self, image: np.ndarray) -> tuple[int, int]:
        """``(rows, columns)`` of placeholders of an image (the processor's resize, then patches merged)."""
        p = self.processor
        factor = p.patch_size * self.merge
        h, w = smart_resize(image.shape[0], image.shape[1], factor=factor, min_pixels=p.size["shortest_edge"],
                            max_pixels=p.size["longest_edge"])
        return h // factor, w // factor

    def placeholders(self, images: list[np.ndarray]) -> list[int]:
        """Placeholders per image: rows x columns of its merged patch grid."""
        return [r * c for r, c in map(self.grid, images)]

    def count(self, ids: list[int]) -> int:
        """Images in ``ids``: runs of ``<|image_pad|>`` (each image's run sits between its start and end tokens)."""
        runs, inside = 0, False
        for t in ids:
            runs += t == self.token_id and not inside
            inside = t == self.token_id
        return runs

    def positions(self, ids: list[int], images: list[np.ndarray], start: int) -> tuple[torch.Tensor, int]:
        """``(3, len(ids))`` M-RoPE positions of ``ids`` from text position ``start``, and the next text position.

        The layout of Qwen2-VL's ``get_rope_index`` for images: a text token takes ``p`` on all three
        rows and the next is ``p + 1``; the image starting at ``p`` puts its placeholder ``(i, j)``
        at ``(p, p + i, p + j)`` and the text after it starts at ``p + max(rows, columns)``.
        """
        grids = iter(self.grid(im) for im in images)
        out = torch.empty(3, len(ids), dtype=torch.long)
        k, pos = 0, start
        while k < len(ids):
            if ids[k] != self.token_id:
                out[:, k] = pos
                k, pos = k + 1, pos + 1
                continue
            rows, cols = next(grids)
            out[0, k:k + rows * cols] = pos
            out[1, k:k + rows * cols] = (torch.arange(rows)[:, None] + pos).expand(rows, cols).reshape(-1)
            out[2, k:k + rows * cols] = (torch.arange(cols)[None, :] + pos).expand(rows, cols).reshape(-1)
            k, pos = k + rows * cols, pos + max(rows, cols)
        return out, pos

    def to_pixels(self, images: list[np.ndarray]) -> torch.Tensor:
        """Canonical ``(H, W, 3)`` uint8 images -> ``(N, 3, H, W)`` float32 holding the same values.

        Raises:
            ValueError: the images differ in size (one forward pass stacks them).
        """
        sizes = {im.shape[:2] for im in images}
        if len(sizes) > 1:
            raise ValueError(f"the observation images have sizes {sorted(sizes)}; a Qwen2-VL policy in arborl reads "
                             "images of one size (render every picture at the same size)")
        return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()

    def patches(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(patches (P, C*T*p*p), image_grid_thw (N, 3))`` of canonical pixels, by the checkpoint's processor."""
        arrays = pixel_values.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        out = self.processor(images=list(arrays), return_tensors="pt")
        return out["pixel_values"].to(pixel_values.device), out["image_grid_thw"].to(pixel_values.device)


class _ArborlCalls:
    """arborl's calling convention over a stock Qwen2-VL-family model (module docstring); mixed in before it.

    ``image_processor`` is set by :func:`load_vlm`.
    """

    image_processor: Qwen2VLImageProcessorPil | None = None
    stock_class: type[PreTrainedModel]
    """The stock transformers class: what ``config.json`` names when the policy is saved."""

    def image_spec(self) -> Qwen2VLImages:
        """How this policy reads images.

        Raises:
            ValueError: no image processor is attached (load the checkpoint with :func:`load_vlm`).
        """
        if self.image_processor is None:
            raise ValueError("this Qwen2-VL policy has no image processor; load it with arborl.policy.load_policy "
                             f"from a checkpoint directory holding {PREPROCESSOR_FILE}")
        return Qwen2VLImages(self.config.image_token_id, self.config.vision_config.spatial_merge_size,
                             self.image_processor)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None,
                cache: Any = None, **kwargs: Any) -> Any:
        """The stock forward on canonical pixels; without ``cache`` the M-RoPE positions are computed here.

        Raises:
            ValueError: ``input_ids`` hold placeholders and no ``pixel_values`` came with them.
        """
        img = self.config.image_token_id
        grid = None
        if pixel_values is not None:
            pixel_values, grid = self.image_spec().patches(pixel_values)
        elif input_ids is not None and bool((input_ids == img).any()):
            raise ValueError("the input has image placeholders but no pixel_values; pass the images "
                             "(training: collate(..., images=arborl.rollout.media.image_inputs(model, store)))")
        if cache is None and input_ids is not None:  # a whole sequence: the model's own positions
            kinds = (input_ids == img).int()
            position_ids, _ = self.model.get_rope_index(input_ids, kinds, grid, attention_mask=attention_mask)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              pixel_values=pixel_values, image_grid_thw=grid, cache=cache, **kwargs)
        hide = torch.zeros(out.logits.shape[-1], dtype=torch.bool, device=out.logits.device)
        hide[[t for t in (img, self.config.video_token_id) if t is not None]] = True
        out.logits = out.logits.masked_fill(hide, MASKED_LOGIT)
        return out

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:
        """Write a stock checkpoint: weights, ``config.json`` naming the stock class, the image processor."""
        super().save_pretrained(save_directory, **kwargs)
        file = Path(save_directory) / "config.json"
        cfg = json.loads(file.read_text(encoding="utf-8"))
        cfg["architectures"] = [self.stock_class.__name__]
        file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if self.image_processor is not None:
            self.image_processor.save_pretrained(save_directory)


class Qwen2VLPolicy(_ArborlCalls, Qwen2VLForConditionalGeneration):
    """Qwen2-VL (``model_type = "qwen2_vl"``) with arborl's calling convention."""

    stock_class = Qwen2VLForConditionalGeneration


class Qwen2_5_VLPolicy(_ArborlCalls, Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL (``model_type = "qwen2_5_vl"``: windowed vision attention, same image positions) with arborl's calling convention."""

    stock_class = Qwen2_5_VLForConditionalGeneration


POLICY_CLASSES: dict[str, type[PreTrainedModel]] = {"qwen2_vl": Qwen2VLPolicy, "qwen2_5_vl": Qwen2_5_VLPolicy}
"""The policy class of each supported ``model_type``."""
SUPPORTED_VLM_TYPES = tuple(POLICY_CLASSES)
"""``model_type`` values of the vision-language checkpoints :func:`load_vlm` runs."""

# transformers finds a class's checkpoint key renames by class name: the subclasses read (and write) the stock layout
for _cls in POLICY_CLASSES.values():
    register_checkpoint_conversion_mapping(
        _cls.__name__, get_checkpoint_conversion_mapping(_cls.stock_class.__name__), overwrite=True)


def vlm_type(d: Path) -> str | None:
    """The ``model_type`` of checkpoint ``d`` if it is a vision-language model (its config has a ``vision_config``).

    Raises:
        ConfigError: it is a vision-language model of a type arborl does not run; the message names those it runs.
    """
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    if "vision_config" not in cfg:
        return None
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_VLM_TYPES:
        raise ConfigError(f"policy checkpoint {str(d)!r} is a {model_type!r} vision-language model, which arborl does not "
                          f"run; supported: {', '.join(SUPPORTED_VLM_TYPES)} (stock checkpoints) and arborl_patch_vlm "
                          "(policy.model.image_size > 0): point policy.init at one of those")
    return model_type


def load_vlm(d: Path, model_type: str, *, dtype: torch.dtype, attn_implementation: str) -> PreTrainedModel:
    """The policy (:data:`POLICY_CLASSES`) of checkpoint directory ``d`` of a supported ``model_type``, with its image processor.

    Raises:
        FileNotFoundError: ``d`` has no ``preprocessor_config.json``.
        ConfigError: the image processor cuts other patches than the vision tower reads.
    """
    if not (d / PREPROCESSOR_FILE).is_file():
        raise FileNotFoundError(f"the {model_type} checkpoint {str(d)!r} has no {PREPROCESSOR_FILE}; copy the image "
                                "processor's config from the model's release next to config.json")
    model = POLICY_CLASSES[model_type].from_pretrained(d, dtype=dtype, attn_implementation=attn_implementation)
    proc = Qwen2VLImageProcessorPil.from_pretrained(d)
    vc = model.config.vision_config
    tower = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size)
    if (proc.patch_size, proc.merge_size, proc.temporal_patch_size) != tower:
        raise ConfigError(f"{str(d)!r}: {PREPROCESSOR_FILE} cuts (patch, merge, temporal patch) = "
                          f"{(proc.patch_size, proc.merge_size, proc.temporal_patch_size)} but the vision tower reads "
                          f"{tower}; use the image processor config released with these weights")
    model.image_processor = proc
    return model
