"""Images in observations: out of the text, into the blob store by reference, back into the model's input.

How an image travels (docs/multimodal.md):

1. An env's ``format_observation`` returns chat messages whose ``content`` is a list of parts,
   ``{"type": "image", "image": array_or_PIL}`` and ``{"type": "text", "text": ...}`` (the Hugging
   Face multimodal message form). :func:`split_images` replaces each image part by the text
   :data:`IMAGE_MARKER` and returns the images as canonical ``(H, W, 3)`` uint8 arrays.
2. The rollout writes each image as PNG into a :class:`MediaSink` (the store's blob store:
   ``BaseStore.put_media``, file or S3) and records the returned content-addressed
   :class:`~arborl.trajectory.schema.MediaRef` on the turn whose prompt shows it
   (``Turn.media``, first, in order); the episode record holds URLs only.
3. The marker is the policy's (``ImageReader.marker``: ``<image>``, or Qwen2-VL's
   ``<|vision_start|><|image_pad|><|vision_end|>``) and the chat template renders its placeholder
   as one token; :func:`expand_markers` widens it to the image's placeholder count
   (``ImageReader.placeholders``), which are the prompt ids recorded on the turn and fed to the
   model, whose image features replace them.
4. Training (:class:`ImageInputs`) reads the refs back in turn order, decodes the PNGs (lossless:
   the same uint8 pixels the rollout fed) and gives the same features the same placeholders.

A blob that is gone raises :class:`~arborl.store.base.StoreError` naming its URL.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from arborl.policy.vision import IMAGE_MARKER, ImageReader, image_spec
from arborl.store.base import StoreError
from arborl.trajectory.schema import MediaRef, Turn

IMAGE_MIME = "image/png"
DECODED_CACHE = 65536
"""Decoded images an :class:`ImageInputs` keeps by URL (then it starts afresh)."""


class MediaSink(Protocol):
    """Where rollouts put media bytes and training reads them back (a store: ``put_media``/``get_media``)."""

    def put_media(self, data: bytes, mime: str = ...) -> MediaRef:
        """Store ``data`` by content; its reference."""
        ...

    def get_media(self, ref: MediaRef | str) -> bytes:
        """The bytes of ``ref``; :class:`StoreError` when missing."""
        ...


class MemoryMedia:
    """A content-addressed in-memory :class:`MediaSink` (``mem://sha256/<hex>``), for episodes that are not stored."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put_media(self, data: bytes, mime: str = "application/octet-stream") -> MediaRef:
        """Keep ``data`` under its sha256; its reference."""
        digest = hashlib.sha256(data).hexdigest()
        url = f"mem://sha256/{digest}"
        self._blobs[url] = bytes(data)
        return MediaRef(url=url, mime=mime, sha256=digest)

    def get_media(self, ref: MediaRef | str) -> bytes:
        """The bytes of ``ref``."""
        url = ref.url if isinstance(ref, MediaRef) else ref
        if url not in self._blobs:
            raise StoreError(f"media blob {url!r} is missing (not in this in-memory media store)")
        return self._blobs[url]


def canonical_image(image: Any) -> np.ndarray:
    """``image`` (numpy ``(H, W)``/``(H, W, 3|4)`` or a PIL image) as a ``(H, W, 3)`` uint8 array.

    Float arrays are read as values in [0, 1]. Raises ValueError for any other shape.
    """
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        image = np.asarray(image.convert("RGB"))
    arr = np.asarray(image)
    if arr.dtype.kind == "f":
        arr = np.clip(np.rint(arr * 255.0), 0, 255)
    arr = arr.astype(np.uint8, copy=False)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"an observation image must be (H, W), (H, W, 3) or (H, W, 4), got shape {arr.shape}")
    return np.ascontiguousarray(arr[:, :, :3])


def encode_png(image: np.ndarray) -> bytes:
    """Lossless PNG bytes of a canonical image."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    """The canonical ``(H, W, 3)`` uint8 array of PNG bytes."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return canonical_image(im)


def split_images(shown: Any, marker: str = IMAGE_MARKER) -> tuple[Any, list[np.ndarray]]:
    """An observation with its image parts replaced by ``marker`` (the policy's, see ``ImageReader.marker``), and the images in order.

    Text observations and messages without list content come back unchanged (no images).
    """
    if isinstance(shown, str) or not any(isinstance(m.get("content"), list) for m in shown):
        return shown, []
    images: list[np.ndarray] = []
    out = []
    for m in shown:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image":
                images.append(canonical_image(part["image"]))
                texts.append(marker)
            elif isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise ValueError(f"an observation content part must be {{'type': 'image'|'text', ...}}, got {part!r}")
        out.append({**m, "content": " ".join(texts)})
    return out, images


def expand_markers(ids: list[int], token_id: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with the k-th ``token_id`` repeated ``counts[k]`` times (one placeholder per image feature).

    Raises:
        ValueError: ``ids`` hold another number of markers than ``counts`` has images.
    """
    out: list[int] = []
    k = 0
    for t in ids:
        if t != token_id:
            out.append(t)
            continue
        if k == len(counts):
            raise ValueError(f"the rendered prompt holds more image markers than its {len(counts)} images")
        out.extend([t] * counts[k])
        k += 1
    if k != len(counts):
        raise ValueError(f"the rendered prompt holds {k} image markers for {len(counts)} images; the chat template "
                         "must keep each image marker of the observation as one token")
    return out


def store_images(images: list[np.ndarray], media: MediaSink | None) -> list[MediaRef]:
    """PNG-encode and put ``images`` into ``media``; their references in order."""
    if not images:
        return []
    if media is None:
        raise ValueError("the observation carries images but run_episodes got no media sink; pass media=store "
                         "(or arborl.rollout.media.MemoryMedia() for episodes that are not stored)")
    return [media.put_media(encode_png(im), IMAGE_MIME) for im in images]


def load_image(ref: MediaRef, media: MediaSink) -> np.ndarray:
    """The canonical image behind ``ref``; :class:`StoreError` naming the URL when it cannot be read."""
    try:
        data = media.get_media(ref)
    except Exception as exc:
        raise StoreError(f"image blob {ref.url!r} of a stored turn cannot be read ({exc}); the training forward "
                         "pass needs every image the rollout showed: restore the blob store or drop the episode") from None
    if ref.sha256 is not None and hashlib.sha256(data).hexdigest() != ref.sha256:
        raise StoreError(f"image blob {ref.url!r} does not match its sha256 {ref.sha256}; the blob store is corrupt")
    return decode_png(data)


def prompt_images(turn: Turn, spec: ImageReader) -> list[MediaRef]:
    """The refs of the images a turn's prompt shows: the first ``spec.count(prompt_ids)`` of ``Turn.media``."""
    k = spec.count(turn.prompt_ids)
    refs = [m for m in turn.media if m.mime.startswith("image/")][:k]
    if len(refs) != k:
        raise StoreError(f"turn {turn.turn_id}: its prompt shows {k} images but it references {len(refs)}")
    return refs


@dataclass
class Eyes:
    """What the rollout does with an observation's images: the policy's placeholders, where the bytes go.

    Attributes:
        spec: How the policy reads images (:class:`~arborl.policy.vision.ImageReader`; ``None``: a text-only policy).
        media: Where images are stored (``None``: an observation with images is an error).
    """

    spec: ImageReader | None = None
    media: MediaSink | None = None

    @property
    def marker(self) -> str:
        """The text an observation's image part becomes (the policy's placeholder marker)."""
        return IMAGE_MARKER if self.spec is None else self.spec.marker

    def prompt(self, ids: list[int], images: list[np.ndarray]) -> list[int]:
        """Rendered prompt ids with each image marker widened to the policy's placeholder run.

        Raises:
            ValueError: there are images and the policy reads text only.
        """
        if not images:
            return ids
        if self.spec is None:
            raise ValueError("the observation carries images but the policy reads text only; use a vision policy "
                             "(policy.model.image_size > 0, arborl.policy.vision)")
        return expand_markers(ids, self.spec.token_id, self.spec.placeholders(images))

    def store(self, images: list[np.ndarray]) -> list[MediaRef]:
        """Put ``images`` into the media store; their references."""
        return store_images(images, self.media)

    def reload(self, turns: Sequence[Turn]) -> list[np.ndarray]:
        """The images the prompts of ``turns`` showed, read back from the media store (a continuation's prefix)."""
        if self.spec is None or self.media is None:
            return []
        return [load_image(ref, self.media) for t in turns for ref in prompt_images(t, self.spec)]


@dataclass
class ImageInputs:
    """Rebuilds a training batch's images from the stored references (same pixels, same order as the rollout).

    Attributes:
        media: Where the blobs are (the run's store).
        spec: How the policy reads images (its placeholders, its ``to_pixels`` preprocessing).
    """

    media: MediaSink
    spec: ImageReader
    _decoded: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Images already read, by URL (content-addressed: a URL's bytes never change)."""

    def image(self, ref: MediaRef) -> np.ndarray:
        """The canonical image of ``ref`` (read once per URL)."""
        got = self._decoded.get(ref.url)
        if got is None:
            if len(self._decoded) >= DECODED_CACHE:
                self._decoded.clear()
            got = self._decoded[ref.url] = load_image(ref, self.media)
        return got

    def rows(self, paths: Sequence[Sequence[Turn]]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(pixel_values (N, C, H, W), image_row (N,))`` of the turns of each row, in token order; None if none."""
        images, row_of = [], []
        for r, turns in enumerate(paths):
            for t in turns:
                for ref in prompt_images(t, self.spec):
                    images.append(self.image(ref))
                    row_of.append(r)
        if not images:
            return None
        return self.spec.to_pixels(images), torch.tensor(row_of, dtype=torch.long)


def media_of(sink: Any) -> MediaSink:
    """The media store of a store or of a writer wrapping one (an object with ``put_media``, or its ``.store``)."""
    return sink if hasattr(sink, "put_media") else sink.store


def image_inputs(model: Any, store: Any) -> ImageInputs | None:
    """The :class:`ImageInputs` a training forward pass of ``model`` needs, reading ``store``; None for a text-only model."""
    spec = image_spec(model)
    if spec is None:
        return None
    return ImageInputs(media_of(store), spec)
