"""A batch KV cache whose rows can be dropped, added and compacted between forward passes.

Hugging Face's ``DynamicLayer`` concatenates every new key onto the whole cache, copying all of
it at each decoding step. :class:`BufferLayer` instead keeps keys and values in a
``(B, H_kv, capacity, D)`` buffer, grown by :data:`GROWTH`, and writes new columns in place; the model
sees ``buffer[:, :, :length]`` views, which batched matmul reads without copying.

:class:`PrefixCache` keeps the keys and values of finished episodes (one row each, real columns
only, in token order) so that continuations of them (branches, tree rollouts) start from the
trunk's cache instead of prefilling its tokens again (:meth:`BatchKVCache.seed_row`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_CAPACITY = 64
"""Smallest number of columns allocated for a layer buffer."""

GROWTH = 4
"""Factor by which a full layer buffer grows: fewer regrowths, each a copy of the whole cache into fresh memory
(doubling regrew the bench's cache four times a rollout; its copies cost ~3% of the engine's time)."""


class BufferLayer(DynamicLayer):
    """One layer's keys and values in a preallocated buffer (see module docstring)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the buffers at the first update (transformers' cache-layer hook)."""
        self.device = key_states.device
        b, h, _, d = key_states.shape
        self._k = key_states.new_zeros(b, h, MIN_CAPACITY, d)
        self._v = value_states.new_zeros(b, h, MIN_CAPACITY, value_states.shape[-1])
        self.length = 0
        self.is_initialized = True
        self._views()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values; returns views of the whole cache for attention."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        self._reserve(self.length + q)
        self._k[:, :, self.length : self.length + q] = key_states
        self._v[:, :, self.length : self.length + q] = value_states
        self.length += q
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """Number of cached positions."""
        return self.length if self.is_initialized else 0

    # --- re-indexing between forward passes -----------------------------------------------------
    def select_rows(self, idx: torch.Tensor) -> None:
        """Keep only rows ``idx`` (in that order)."""
        if self.is_initialized:
            self._k, self._v = self._k.index_select(0, idx), self._v.index_select(0, idx)
            self._views()

    def add_rows(self, k: int) -> None:
        """Append ``k`` empty rows (their columns must be masked by the caller)."""
        if self.is_initialized:
            self._k = torch.cat([self._k, self._k.new_zeros(k, *self._k.shape[1:])])
            self._v = torch.cat([self._v, self._v.new_zeros(k, *self._v.shape[1:])])
            self._views()

    def gather_columns(self, idx: torch.Tensor) -> None:
        """Replace the columns of row ``b`` by ``columns[b, idx[b]]``; ``idx`` is ``(B, L')``."""
        if not self.is_initialized:
            return
        b, h, _, d = self._k.shape
        n = idx.shape[1]
        cap = max(MIN_CAPACITY, n + n // 2)
        # uninitialised past n: update() writes columns before the views expose them, and extend()
        # zeroes the columns it exposes (a masked column still enters the weighted sum of values,
        # and 0 * NaN is NaN)
        k, v = self._k.new_empty(b, h, cap, d), self._v.new_empty(b, h, cap, self._v.shape[-1])
        # advanced indexing copies whole D-vectors (gather with an expanded index reads one index per
        # element: ~1.5x slower); the values are the same
        rows, heads = torch.arange(b, device=idx.device)[:, None, None], torch.arange(h, device=idx.device)[None, :, None]
        cols = idx[:, None, :]
        k[:, :, :n] = self._k[rows, heads, cols]
        v[:, :, :n] = self._v[rows, heads, cols]
        self._k, self._v, self.length = k, v, n
        self._views()

    def row_columns(self, row: int, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of row ``row``'s keys and values at columns ``cols``: ``(H, n, D)`` each."""
        return self._k[row][:, cols].clone(), self._v[row][:, cols].clone()

    def extend(self, length: int, rows: int, like: torch.Tensor, v_dim: int) -> None:
        """Grow to ``length`` columns (new ones zero, to be masked); allocate ``rows`` rows like ``like`` if empty."""
        if not self.is_initialized:
            h, _, d = like.shape
            self.device = like.device
            cap = max(MIN_CAPACITY, length)
            self._k, self._v = like.new_zeros(rows, h, cap, d), like.new_zeros(rows, h, cap, v_dim)
            self.length, self.is_initialized = 0, True
        self._reserve(length)
        if length > self.length:
            self._k[:, :, self.length:length] = 0
            self._v[:, :, self.length:length] = 0
            self.length = length
        self._views()

    def seed_row(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``(H, n, D)`` keys and values into the last ``n`` columns of row ``row``."""
        n = k.shape[1]
        self._k[row, :, self.length - n:self.length] = k
        self._v[row, :, self.length - n:self.length] = v

    def _reserve(self, needed: int) -> None:
        cap = self._k.shape[2]
        if needed <= cap:
            return
        new_cap = max(needed, GROWTH * cap)
        b, h, _, d = self._k.shape
        # uninitialised past the used columns, as in gather_columns (zeroing 2 x 64 MB cost more than the copy)
        k, v = self._k.new_empty(b, h, new_cap, d), self._v.new_empty(b, h, new_cap, self._v.shape[-1])
        k[:, :, : self.length] = self._k[:, :, : self.length]
        v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]


class BatchKVCache(Cache):
    """A ``Cache`` of :class:`BufferLayer`, one per decoder layer, created on first use."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=BufferLayer)

    def buffer_layers(self) -> list[BufferLayer]:
        """The layers, checked to be :class:`BufferLayer` (models with other cache types are refused)."""
        for layer in self.layers:
            if not isinstance(layer, BufferLayer):
                raise TypeError(
                    f"cache layer {type(layer).__name__} is not supported by the rollout engine; use a model with "
                    "full attention in every layer"
                )
        return list(self.layers)

    def select_rows(self, idx: torch.Tensor) -> None:
        """Keep only the batch rows ``idx`` (in that order) in every layer."""
        for layer in self.buffer_layers():
            layer.select_rows(idx)

    def add_rows(self, k: int) -> None:
        """Append ``k`` empty batch rows to every layer."""
        for layer in self.buffer_layers():
            layer.add_rows(k)

    def gather_columns(self, idx: torch.Tensor) -> None:
        """Reorder or drop cached positions per row (``idx``: ``[B, L]`` column indices) in every layer."""
        for layer in self.buffer_layers():
            layer.gather_columns(idx)

    def row_columns(self, row: int, cols: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, copies of row ``row``'s keys and values at columns ``cols``."""
        return [layer.row_columns(row, cols) for layer in self.buffer_layers() if layer.is_initialized]

    def seed_row(self, row: int, rows: int, length: int, kept: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give row ``row`` (of ``rows``) the kept keys and values in its last columns, the cache ``length`` wide.

        Every layer grows to ``length`` columns first (the new ones are padding for the other rows);
        the caller extends the attention mask to match.
        """
        while len(self.layers) < len(kept):
            self.layers.append(BufferLayer())
        for layer, (k, v) in zip(self.buffer_layers(), kept, strict=True):
            layer.extend(length, rows, k, v.shape[-1])
            layer.seed_row(row, k, v)


@dataclass
class KeptRow:
    """One finished episode's cache: the tokens it holds and, per layer, their keys and values."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PrefixCache:
    """Kept caches of finished episodes by key (an episode id), for their continuations.

    The trunk's rollout keeps each finished episode's row (:meth:`LMSession.keep`); a
    continuation whose prefix tokens start with a kept row's tokens is seeded with the longest
    common prefix and prefills only the rest. Counters say how many prefix tokens were taken
    from kept rows and how many had to be prefilled. Memory: per kept token, ``2 * layers *
    kv_heads * head_dim`` floats (about 4 KiB for the demo's policy).
    """

    rows: dict[Hashable, KeptRow] = field(default_factory=dict)
    reused_tokens: int = 0
    """Prefix tokens of continuations taken from kept rows (prefill saved)."""
    prefilled_tokens: int = 0
    """Prefix tokens of continuations that were prefilled (no kept row, or past its end)."""

    def match(self, key: Hashable | None, ids: list[int]) -> tuple[int, KeptRow | None]:
        """``(n, row)``: how many of ``ids`` the kept row ``key`` holds from the start (0 and None if none)."""
        row = self.rows.get(key) if key is not None else None
        if row is None:
            return 0, None
        n = 0
        for a, b in zip(row.ids, ids, strict=False):
            if a != b:
                break
            n += 1
        return n, row

    def clear(self) -> None:
        """Drop every kept row (the counters stay)."""
        self.rows.clear()
