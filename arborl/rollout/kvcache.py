"""A batch KV cache whose rows can be dropped, added and compacted between forward passes.

Hugging Face's ``DynamicLayer`` concatenates every new key onto the whole cache, copying all of
it at each decoding step. :class:`BufferLayer` instead keeps keys and values in a
``(B, H_kv, capacity, D)`` buffer, grown by doubling, and writes new columns in place; the model
sees ``buffer[:, :, :length]`` views, which batched matmul reads without copying.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_CAPACITY = 64
"""Smallest number of columns allocated for a layer buffer."""


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
        # columns past n are written by update() before any view covers them: no need to zero them
        k, v = self._k.new_empty(b, h, cap, d), self._v.new_empty(b, h, cap, self._v.shape[-1])
        # advanced indexing copies whole D-vectors (gather with an expanded index reads one index per
        # element: ~1.5x slower); the values are the same
        rows, heads = torch.arange(b, device=idx.device)[:, None, None], torch.arange(h, device=idx.device)[None, :, None]
        cols = idx[:, None, :]
        k[:, :, :n] = self._k[rows, heads, cols]
        v[:, :, :n] = self._v[rows, heads, cols]
        self._k, self._v, self.length = k, v, n
        self._views()

    def _reserve(self, needed: int) -> None:
        cap = self._k.shape[2]
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap)
        b, h, _, d = self._k.shape
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
