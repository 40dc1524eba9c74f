"""The rollout engine's own forward pass over the kept KV cache, for Llama-family text models.

:class:`~arborl.rollout.generate.LMSession` feeds a few new columns per row after a cache of
hundreds. The generic Hugging Face forward builds a 4-D float mask at every step and gives every
operation of its attention a fresh score tensor; at prefill sizes (64 rows x 4 heads x 54 x 500
floats, ~28 MB) each such allocation is page-faulted anew and costs more than the arithmetic.

:func:`fast_forward` runs the same modules (embedding, norms, projections, rotary embedding,
MLP: the model's own code) in the same order, with its own attention over the kept cache:

* the score, mask and softmax steps are those of transformers' eager attention, the same
  operations on the same values, done in place where that gives the same numbers;
* the attention runs over a few batch rows at a time, so its temporaries stay small and are
  reused from the allocator instead of being page-faulted anew.

Computing the last layer's queries, attention and MLP for the last column only (the others'
outputs are never read) saved ~20% of a prefill but is not exact: a matrix product's rounding
depends on its number of rows (the log-probs moved by 1 ulp), so it is not done.

The result is bit-identical to the generic forward (``tests/rollout/test_decoder.py`` and the
engine's golden fingerprints). Models it does not know (vision models, other attention
implementations, sliding windows) take the generic path: :func:`supports` says which.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from arborl.rollout.kvcache import BatchKVCache

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
"""Model classes whose decoder layers :func:`fast_forward` replays (text-only, eager attention)."""

SCORE_BYTES = 1 << 21
"""Largest attention score block computed at once (bytes): bigger batches are split by rows."""


def supports(model: Any) -> bool:
    """Whether :func:`fast_forward` reproduces ``model``'s forward pass exactly.

    Llama and Qwen2 causal LMs with eager attention, full attention in every layer and no
    rotary scaling the rotary module applies per call (dynamic RoPE): the layers are replayed
    with the model's own modules, so their numbers are the generic forward's.
    """
    if type(model).__name__ not in SUPPORTED:
        return False
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "eager" or getattr(cfg, "sliding_window", None) and getattr(
        cfg, "use_sliding_window", False
    ):
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    return rope.get("rope_type", "default") == "default" and not model.training


def fast_forward(model: Any, cache: BatchKVCache, ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """Feed ``(B, C)`` tokens after the cache and return the last column's ``(B, V)`` logits.

    Args:
        model: A model :func:`supports` accepts.
        cache: The batch cache (updated in place: every layer gains ``C`` columns).
        ids: ``(B, C)`` token ids.
        mask: ``(B, L + C)`` 0/1 mask of real columns, cached ones first.
        positions: ``(B, C)`` rotary positions of the new columns.

    Returns:
        The logits of each row's last column.
    """
    core = model.model
    hidden = core.embed_tokens(ids)
    cos, sin = core.rotary_emb(hidden, positions)
    bias = _bias(mask, ids.shape[1], hidden.dtype)
    for i, layer in enumerate(core.layers[: model.config.num_hidden_layers]):
        hidden = _layer(layer, i, hidden, cos, sin, bias, cache)
    # the last column only after the norm, as transformers' logits_to_keep=1 does: the output
    # projection over every column would round differently (a GEMM's result depends on its size)
    return model.lm_head(core.norm(hidden)[:, -1:])[:, -1]


def _layer(layer: Any, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
           cache: BatchKVCache) -> torch.Tensor:
    """One decoder layer as transformers' Llama/Qwen2 decoder layer computes it, attention over the kept cache."""
    attn = layer.self_attn
    b, c, _ = hidden.shape
    shape = (b, c, -1, attn.head_dim)
    x = layer.input_layernorm(hidden)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    family = sys.modules[type(attn).__module__]  # transformers' modeling_llama / modeling_qwen2
    q, k = family.apply_rotary_pos_emb(q, k, cos, sin)
    k, v = cache.update(k, v, index)
    groups = attn.num_key_value_groups
    k, v = family.repeat_kv(k, groups), family.repeat_kv(v, groups)
    hidden = hidden + attn.o_proj(_attend(q, k, v, bias, attn.scaling))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _bias(mask: torch.Tensor, c: int, dtype: torch.dtype) -> torch.Tensor:
    """Transformers' eager additive mask: ``(B, 1, C, L + C)``, 0 where a column is real and not in the future."""
    total = mask.shape[1]
    allowed = mask.bool()[:, None, :]
    if c > 1:
        cols = torch.arange(total, device=mask.device)
        causal = cols[None, :] <= (total - c + torch.arange(c, device=mask.device))[:, None]  # (C, L + C)
        allowed = allowed & causal[None]
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scaling: float) -> torch.Tensor:
    """Eager attention (scores, scale, additive mask, float32 softmax, weighted values), a few rows at a time.

    ``q`` is ``(B, H, C, D)``, ``k``/``v`` ``(B, H, L, D)`` (key/value heads already repeated to ``H``);
    returns ``(B, C, H * D)``.
    """
    b, h, c, d = q.shape
    step = max(1, SCORE_BYTES // max(1, h * c * k.shape[2] * q.element_size()))
    out = q.new_empty(b, c, h, d)
    for r in range(0, b, step):
        w = torch.matmul(q[r:r + step], k[r:r + step].transpose(2, 3))
        w.mul_(scaling)
        w.add_(bias[r:r + step])
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        out[r:r + step] = torch.matmul(w, v[r:r + step]).transpose(1, 2)
    return out.view(b, c, h * d)
