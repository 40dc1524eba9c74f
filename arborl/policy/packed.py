"""Log-probs over a batch's prefix tree: every shared prefix computed once (prefix-shared training).

The rows an RL update trains on share long prefixes: a group's rollouts start from the same prompt,
a branch or tree continuation carries its trunk's turns, and every row begins with the same chat
template. In a causal model a token's hidden states depend only on the tokens before it, so rows
that agree up to position ``t`` have the same hidden states up to ``t``; a padded ``(B, T)`` batch
computes them once per row. :func:`trie_pack` merges the rows into a prefix tree (one node per
distinct prefix) and lays its nodes out in a few packed sequences; a node attends to its
ancestors and itself only (an additive attention bias) at its depth as the rotary position. One
forward and backward pass over the nodes then gives every row's log-probs and the same gradients
as the padded batch: a shared node's hidden state receives the sum of the gradients its rows'
copies would have received. The numbers equal the padded path's to float rounding (other matrix
shapes, other kernels): ``tests/policy/test_packed.py`` checks log-probs, entropies and gradients.

This is the training-side counterpart of branch rollouts started from the trunk's kept KV cache:
the trunk's prefix is neither re-prefilled to sample a branch nor recomputed to train on it. The
idea is the shared-prefix forward of Prefix Grouper (Liu et al., 2025) and tree packing of
Tree-GRPO-style rollouts; here it is exact attention over a tree mask, for the Llama and Qwen2
bodies that :mod:`arborl.policy.tail` replays. Other models take the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arborl.policy import tail
from arborl.policy.logprobs import _body_and_head, _check, _entropy, _logprobs


@dataclass
class Packing:
    """A batch's prefix tree laid out in ``P`` packed sequences of ``L`` slots.

    Attributes:
        input_ids: ``(P, L)`` the token of each node (0 on unused slots).
        position_ids: ``(P, L)`` each node's depth (its token's position in its rows).
        bias: ``(P, 1, L, L)`` additive attention bias: 0 where the key node is an ancestor of the
            query node or the node itself, the dtype's minimum elsewhere.
        node: ``(B, T)`` long, flat index ``p * L + j`` of the node that holds each real token of the
            batch; -1 on padding.
        nodes: the number of nodes (distinct prefixes) in all packs.
    """

    input_ids: Tensor
    position_ids: Tensor
    bias: Tensor
    node: Tensor
    nodes: int


def distinct_prefixes(input_ids: Tensor, attention_mask: Tensor) -> int:
    """How many distinct prefixes (prefix-tree nodes) the rows' real tokens have: the tokens a packed pass computes."""
    rows = lexicographic(input_ids, attention_mask)[0]
    return sum(len(r) - lcp for r, lcp in zip(rows, lcps(rows), strict=True))


def lexicographic(input_ids: Tensor, attention_mask: Tensor) -> tuple[list[list[int]], Tensor]:
    """The rows' real tokens in lexicographic order, and that order (row indices)."""
    rows = _real_rows(input_ids, attention_mask)[0]
    order = _order(rows)
    return [rows[b] for b in order], torch.tensor(order, dtype=torch.long)


def trie_pack(input_ids: Tensor, attention_mask: Tensor, pack_tokens: int,
              dtype: torch.dtype = torch.float32) -> Packing:
    """Merge the rows' real tokens into a prefix tree and lay it out in packs of at most ``pack_tokens`` nodes.

    Rows are visited in lexicographic order, so each row shares its longest common prefix with the
    row before it, which is its longest with any earlier row: its first ``lcp`` tokens are that
    row's nodes, the rest are new. A row that does not fit into the current pack starts a new one
    (and re-creates its prefix there); a row longer than ``pack_tokens`` gets a pack of its own. A
    pack's attention cost grows with the square of its length, so ``pack_tokens`` trades sharing
    across packs against attention over masked pairs.

    Args:
        input_ids: ``(B, T)`` token ids.
        attention_mask: ``(B, T)`` 1 on real tokens (left, right or inner padding all allowed).
        pack_tokens: the most nodes a pack holds (at least 1).
        dtype: the bias's dtype (the model's).
    """
    if pack_tokens < 1:
        raise ValueError(f"pack_tokens is {pack_tokens}; use a positive number of nodes per pack")
    rows, cols = _real_rows(input_ids, attention_mask)
    order = _order(rows)
    ordered = [rows[b] for b in order]
    shared = lcps(ordered)
    packs: list[list[int]] = []  # per pack: node tokens
    paths: list[tuple[int, list[int]]] = [(0, [])] * len(rows)  # per row: (pack, node slot per real token)
    prev_path: list[int] = []
    placed = layout([len(r) for r in ordered], shared, pack_tokens)
    for b, row, lcp, p in zip(order, ordered, shared, placed, strict=True):
        if p == len(packs):  # a new pack: the row's prefix is created again there
            packs.append([])
            lcp = 0
        pack = packs[-1]
        path = prev_path[:lcp] + list(range(len(pack), len(pack) + len(row) - lcp))
        pack.extend(row[lcp:])
        paths[b] = (p, path)
        prev_path = path
    n_packs, width = max(len(packs), 1), max((len(p) for p in packs), default=1)
    ids = torch.zeros(n_packs, width, dtype=torch.long)
    pos = torch.zeros(n_packs, width, dtype=torch.long)
    allowed = torch.zeros(n_packs, width, width, dtype=torch.bool)
    allowed[:, torch.arange(width), torch.arange(width)] = True  # unused slots see themselves (no empty softmax)
    node = torch.full(tuple(input_ids.shape), -1, dtype=torch.long)
    tri: dict[int, Tensor] = {}
    for b, (p, path) in enumerate(paths):
        if not path:
            continue
        at = torch.tensor(path)
        n = len(path)
        ids[p, at] = torch.tensor(rows[b])
        pos[p, at] = torch.arange(n)
        if n not in tri:
            tri[n] = torch.tril_indices(n, n)
        q, k = tri[n]
        allowed[p, at[q], at[k]] = True  # a node sees its path's nodes up to itself
        node[b, cols[b]] = p * width + at
    zero = torch.zeros((), dtype=dtype)
    bias = torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]
    device = input_ids.device
    return Packing(ids.to(device), pos.to(device), bias.to(device), node.to(device), sum(len(p) for p in packs))


def packed_token_logprobs_and_entropy(
    model,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    positions: Tensor,
    entropy_grad: bool = True,
    pack_tokens: int = 512,
) -> tuple[Tensor, Tensor]:
    """:func:`arborl.policy.token_logprobs_and_entropy` at ``positions``, over the rows' prefix tree.

    The same ``(B, T)`` log-probs and entropies (0 outside ``positions``), to float rounding, from
    one pass over the distinct prefixes (:func:`trie_pack`, packs of at most
    ``max(pack_tokens, longest row)`` nodes) with the last layer only at the nodes whose prediction
    is read. A model that :mod:`arborl.policy.tail` does not replay takes the padded path.
    """
    mask = _check(input_ids, attention_mask, temperature)
    if positions.shape != input_ids.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} differs from input_ids {tuple(input_ids.shape)}")
    entropy = "grad" if entropy_grad else "detached"
    parts = _body_and_head(model)
    if parts is None or not tail.supports(parts[0]):
        return _logprobs(model, input_ids, mask, temperature, positions, entropy)
    body, head = parts
    longest = int(mask.sum(-1).max()) if mask.numel() else 1
    pk = trie_pack(input_ids, mask, max(pack_tokens, longest), body.embed_tokens.weight.dtype)
    # a wanted token is read from its predecessor's node: the previous real token of its row
    pred = torch.full_like(pk.node, -1)
    real = mask.bool()
    for b in range(input_ids.shape[0]):
        at = real[b].nonzero()[:, 0]
        pred[b, at[1:]] = pk.node[b, at[:-1]]
    want = positions.bool() & (pred >= 0)
    rows, cols = want.nonzero(as_tuple=True)
    parent = pred[rows, cols]  # (N,) flat node index
    read = torch.zeros(pk.input_ids.numel(), dtype=torch.bool, device=mask.device)
    read[parent] = True
    rank = read.cumsum(0) - 1  # a read node's row in the hidden states below
    hidden = tail.biased_hidden_at(body, pk.input_ids, pk.position_ids, pk.bias, read.view(pk.input_ids.shape))
    logp_all = torch.log_softmax(head(hidden).float() / temperature, dim=-1)  # (distinct parents, V)
    picked = logp_all[rank[parent], input_ids[rows, cols]]
    ent = _entropy(logp_all, entropy)

    def scatter(values: Tensor) -> Tensor:
        return values.new_zeros(input_ids.shape).index_put((rows, cols), values)

    return scatter(picked), None if ent is None else scatter(ent[rank[parent]])


def lcps(ordered: list[list[int]]) -> list[int]:
    """Each row's longest common prefix with the row before it (0 for the first)."""
    return [common_prefix(r, prev) for prev, r in zip([[], *ordered[:-1]], ordered, strict=True)]


def _order(rows: list[list[int]]) -> list[int]:
    """Row indices in the lexicographic order of the rows' tokens."""
    return sorted(range(len(rows)), key=rows.__getitem__)


def layout(lengths: list[int], shared: list[int], pack_tokens: int) -> list[int]:
    """The pack of each row (in lexicographic order, ``shared`` tokens with the row before): a row joins the current
    pack while its new nodes fit; one that does not (or is longer than ``pack_tokens``) starts the next.
    """
    out, size = [], 0
    for n, lcp in zip(lengths, shared, strict=True):
        if not out or (size and size + n - lcp > pack_tokens):
            out.append(out[-1] + 1 if out else 0)
            size = n
        else:
            out.append(out[-1])
            size += n - lcp
    return out


def _cost(model, rows: int, width: int) -> float:
    """Estimated multiply-adds of one layer over ``rows`` sequences of ``width`` columns (dense attention)."""
    cfg = model.config
    h, inter = cfg.hidden_size, cfg.intermediate_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    kv = (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    per_token = 2 * h * h + 2 * h * kv + 3 * h * inter  # q, o; k, v; the MLP's three
    per_pair = 2 * heads * head_dim  # scores and weighted values
    return rows * width * per_token + rows * width * width * per_pair


def padded_cost(model, widths: list[tuple[int, int]]) -> float:
    """:func:`_cost` of padded passes, one ``(rows, width)`` each."""
    return sum(_cost(model, r, w) for r, w in widths)


def best_pack_tokens(model, input_ids: Tensor, attention_mask: Tensor, cap: int) -> tuple[int, float]:
    """The pack size up to ``max(cap, longest row)`` whose layout costs least (:func:`_cost`), and that cost.

    Small packs repeat the prefixes they share with other packs; large ones pay attention over the
    masked pairs of unrelated rows. Tried: the longest row times 1, 2, 4, ... and the cap.
    """
    ordered = lexicographic(input_ids, attention_mask)[0]
    shared, lengths = lcps(ordered), [len(r) for r in ordered]
    longest = max(lengths, default=1)
    top = max(cap, longest)
    sizes = sorted({top, *(longest << k for k in range(12) if longest << k < top)})
    best = (top, float("inf"))
    for size in sizes:
        packs = layout(lengths, shared, size)
        nodes = [0] * (packs[-1] + 1 if packs else 1)
        for n, lcp, p, q in zip(lengths, shared, packs, [-1, *packs[:-1]], strict=True):
            nodes[p] += n - (lcp if p == q else 0)
        cost = _cost(model, len(nodes), max(nodes))
        if cost < best[1]:
            best = (size, cost)
    return best


def supported(model) -> bool:
    """Whether :func:`packed_token_logprobs_and_entropy` runs ``model`` packed (not the padded path)."""
    parts = _body_and_head(model)
    return parts is not None and tail.supports(parts[0])


def _real_rows(input_ids: Tensor, attention_mask: Tensor) -> tuple[list[list[int]], list[Tensor]]:
    """Each row's real tokens (as a list) and their columns."""
    real = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    cols = [real[b].nonzero()[:, 0] for b in range(ids.shape[0])]
    return [ids[b, c].tolist() for b, c in enumerate(cols)], cols


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
