"""Final hidden states at a few positions of a batch, with the last layer computed only there.

A trainer needs log-probs only at trained tokens (the loss mask: model-written tokens, 5-15% of
an agent episode whose observations and tool results are never trained on), so only the final
hidden states at their predecessors are read. Every layer but the last must still run over
every column (later columns attend to their keys and values), and the last layer's keys and
values too; but its queries, attention, output projection and MLP are needed only at the
columns that are read. For a two-layer policy that is about a third of the forward pass's
arithmetic (and of the backward pass's), less with more layers.

:func:`hidden_at` replays a Llama or Qwen2 text model's body (eager attention, full attention in every
layer) with the model's own modules in transformers' order: embedding, rotary embedding, the
decoder layers (input norm, projections, rotary, eager attention with transformers' additive
mask, output projection, residual, post-attention norm, MLP, residual) and the final norm, so
gradients reach every parameter as the generic forward's do. The last layer gathers each row's
wanted columns (padded to the row with the most) before its query projection and keeps them
through the MLP. The numbers equal the generic forward's to float rounding: a matrix product
over fewer rows may take another kernel (``tests/policy/test_logprobs_selective.py`` checks
values and gradients against the full path).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

SUPPORTED = ("LlamaModel", "Qwen2Model")
"""Transformer bodies whose decoder layers :func:`hidden_at` replays (a causal LM's ``base_model``)."""

ENABLED = True
"""Switch for A/B measurements (``bench/logprobs.py``): ``False`` runs every layer over every column."""

MAX_SHARE = 0.5
"""Largest share of a batch's columns (per row, the row with the most) for which the tail pays off."""


def supports(body: Any) -> bool:
    """Whether :func:`hidden_at` replays ``body``: a Llama/Qwen2 body with eager attention in every layer."""
    if not ENABLED or type(body).__name__ not in SUPPORTED:
        return False
    cfg = body.config
    if getattr(cfg, "_attn_implementation", None) != "eager":
        return False
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return False
    layer_types = getattr(cfg, "layer_types", None)
    return not layer_types or all(t == "full_attention" for t in layer_types)


def worth_it(want: torch.Tensor) -> bool:
    """Whether the wanted ``(B, T)`` columns are few enough (see :data:`MAX_SHARE`) and not none."""
    counts = want.sum(1)
    return bool(counts.any()) and int(counts.max()) <= MAX_SHARE * want.shape[1]


def final_hidden(body: Any, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 want: torch.Tensor) -> torch.Tensor:
    """``body(...).last_hidden_state[want]``: ``(N, hidden)`` in row-major order, the last layer only there.

    :func:`hidden_at` where the body :func:`supports` it and the wanted columns are few
    (:func:`worth_it`), else the body's own forward over every column.
    """
    if supports(body) and worth_it(want):
        return hidden_at(body, input_ids, mask, position_ids, want)
    return body(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False)[0][want]


def hidden_rows(body: Any, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                flat: torch.Tensor) -> torch.Tensor:
    """Final hidden states at flat ``b * T + t`` indices ``flat`` (repeats allowed): ``(len(flat), hidden)``.

    :func:`final_hidden` at the distinct indices, read back in ``flat``'s order.
    """
    want = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    want[flat] = True
    rank = want.cumsum(0) - 1  # a wanted index's row in final_hidden's output
    return final_hidden(body, input_ids, mask, position_ids, want.view(mask.shape))[rank[flat]]


def hidden_at(body: Any, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
              want: torch.Tensor) -> torch.Tensor:
    """The final (normed) hidden states at the ``want`` columns: ``(N, hidden)`` in row-major order.

    The rows of ``body(...).last_hidden_state[want]``, to float rounding.

    Args:
        body: A transformer body :func:`supports` accepts (a causal LM's ``base_model``).
        input_ids: ``(B, T)`` token ids.
        mask: ``(B, T)`` 0/1 mask of real tokens.
        position_ids: ``(B, T)`` rotary positions.
        want: ``(B, T)`` bool, the columns whose hidden states are returned (the order of
            ``want.nonzero()``).
    """
    bias = eager_bias(mask, mask.shape[1], body.embed_tokens.weight.dtype)  # (B, 1, T, T)
    return biased_hidden_at(body, input_ids, position_ids, bias, want)


def biased_hidden_at(body: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, bias: torch.Tensor,
                     want: torch.Tensor) -> torch.Tensor:
    """:func:`hidden_at` under any additive attention ``bias`` ``(B, 1, T, T)`` (0: attend; the dtype's minimum: not).

    The bias says which column each query sees, so one row can hold several sequences (a
    prefix tree packed by :mod:`arborl.policy.packed`) with their own ``position_ids``.
    """
    hidden = body.embed_tokens(input_ids)
    cos, sin = body.rotary_emb(hidden, position_ids)
    layers = body.layers[: body.config.num_hidden_layers]
    for layer in layers[:-1]:
        hidden = _layer(layer, hidden, cos, sin, bias)
    counts = want.sum(1)  # (B,)
    q = int(counts.max())
    # each row's wanted columns first (ascending), padded with column 0
    order = torch.sort((~want).to(torch.int8), dim=1, stable=True).indices[:, :q]  # (B, Q)
    valid = torch.arange(q, device=want.device)[None, :] < counts[:, None]  # (B, Q)
    cols = torch.where(valid, order, torch.zeros_like(order))
    hidden = _layer(layers[-1], hidden, cos, sin, bias, cols)  # (B, Q, H)
    return body.norm(hidden[valid])


def _rows(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``x[b, cols[b, j]]`` for ``(B, T, ...)`` ``x`` and ``(B, Q)`` ``cols``: ``(B, Q, ...)``."""
    index = cols.reshape(*cols.shape, *([1] * (x.dim() - 2))).expand(*cols.shape, *x.shape[2:])
    return x.gather(1, index)


def _layer(layer: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
           cols: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer as transformers computes it; with ``cols`` ``(B, Q)``, only at those columns."""
    attn = layer.self_attn
    family = sys.modules[type(attn).__module__]  # transformers' modeling_llama / modeling_qwen2
    b, t, _ = hidden.shape
    x = layer.input_layernorm(hidden)
    heads = (b, t, -1, attn.head_dim)
    k = attn.k_proj(x).view(heads).transpose(1, 2)
    v = attn.v_proj(x).view(heads).transpose(1, 2)
    if cols is None:
        q = attn.q_proj(x).view(heads).transpose(1, 2)
        q, k = family.apply_rotary_pos_emb(q, k, cos, sin)
    else:
        q = attn.q_proj(_rows(x, cols)).view(b, cols.shape[1], -1, attn.head_dim).transpose(1, 2)
        # rotate the wanted queries with their own positions' angles, every key with its own
        q = q * _rows(cos, cols)[:, None] + family.rotate_half(q) * _rows(sin, cols)[:, None]
        k = k * cos[:, None] + family.rotate_half(k) * sin[:, None]
        bias = bias.gather(2, cols[:, None, :, None].expand(b, 1, cols.shape[1], t))
        hidden = _rows(hidden, cols)
    k = family.repeat_kv(k, attn.num_key_value_groups)
    v = family.repeat_kv(v, attn.num_key_value_groups)
    w = torch.matmul(q, k.transpose(2, 3)) * attn.scaling + bias
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = torch.nn.functional.dropout(w, p=attn.attention_dropout if attn.training else 0.0, training=attn.training)
    out = torch.matmul(w, v).transpose(1, 2).reshape(*hidden.shape[:2], -1)
    hidden = hidden + attn.o_proj(out)
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def eager_bias(mask: torch.Tensor, c: int, dtype: torch.dtype) -> torch.Tensor:
    """Transformers' eager additive mask for ``c`` new columns after ``L`` kept ones: ``(B, 1, C, L + C)``.

    0 where a key column is real (``mask``, ``(B, L + C)``) and not after the query's, the dtype's
    minimum elsewhere.
    """
    total = mask.shape[1]
    allowed = mask.bool()[:, None, :]
    if c > 1:
        cols = torch.arange(total, device=mask.device)
        causal = cols[None, :] <= (total - c + torch.arange(c, device=mask.device))[:, None]  # (C, L + C)
        allowed = allowed & causal[None]
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]
