"""BatchKVCache: in-place growth, row selection, row addition and column compaction."""

from __future__ import annotations

import torch

from arborl.rollout.kvcache import MIN_CAPACITY, BatchKVCache


def _kv(b: int, n: int, start: float) -> torch.Tensor:
    # Value = start + column index, so every column is identifiable.
    return (torch.arange(n, dtype=torch.float32) + start).view(1, 1, n, 1).expand(b, 2, n, 3).clone()


def test_update_appends_and_grows_past_capacity():
    cache = BatchKVCache()
    k, v = cache.update(_kv(2, 5, 0.0), _kv(2, 5, 100.0), 0)
    assert k.shape == (2, 2, 5, 3) and cache.get_seq_length() == 5
    k, v = cache.update(_kv(2, MIN_CAPACITY, 5.0), _kv(2, MIN_CAPACITY, 105.0), 0)
    assert k.shape == (2, 2, 5 + MIN_CAPACITY, 3)
    assert k[0, 0, :, 0].tolist() == list(range(5 + MIN_CAPACITY))
    assert v[1, 1, :, 2].tolist() == [100.0 + i for i in range(5 + MIN_CAPACITY)]


def test_select_add_and_gather_rows_and_columns():
    cache = BatchKVCache()
    keys = torch.stack([_kv(1, 4, 10.0 * r)[0] for r in range(3)])  # row r holds 10r + col
    cache.update(keys, keys.clone(), 0)
    cache.select_rows(torch.tensor([2, 0]))
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[20, 21, 22, 23], [0, 1, 2, 3]]
    cache.add_rows(1)
    assert cache.layers[0].keys[2].abs().sum() == 0 and cache.get_seq_length() == 4
    cache.gather_columns(torch.tensor([[1, 3], [0, 2], [0, 0]]))
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[21, 23], [0, 2], [0, 0]]
    assert cache.get_seq_length() == 2
    k, _ = cache.update(_kv(3, 1, 7.0), _kv(3, 1, 7.0), 0)
    assert k[:, 0, :, 0].tolist() == [[21, 23, 7], [0, 2, 7], [0, 0, 7]]
