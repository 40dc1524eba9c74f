"""Prefix-shared log-probs (arborl.policy.packed): the prefix tree by hand, and the padded path's numbers and gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

from arborl.policy import token_logprobs_and_entropy
from arborl.policy.packed import distinct_prefixes, packed_token_logprobs_and_entropy, trie_pack

V = 40
MIN = torch.finfo(torch.float32).min


def _padded(rows: list[list[int]], left: set[int] = frozenset(), extra: int = 0):
    """Rows right-padded (left-padded for the indices in ``left``) to the longest plus ``extra`` columns."""
    width = max(len(r) for r in rows) + extra
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        start = width - len(r) if b in left else 0
        ids[b, start:start + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[b, start:start + len(r)] = 1
    return ids, mask


def test_the_prefix_tree_of_three_rows_by_hand():
    # rows 0 and 2 share "5 6"; row 1 is alone; row 2 is left-padded
    ids, mask = _padded([[5, 6, 7], [9], [5, 6, 8]], left={2})
    pk = trie_pack(ids, mask, pack_tokens=100)
    # lexicographic order: [5 6 7], [5 6 8], [9] -> nodes 5 6 7 | 8 | 9 in one pack
    assert pk.nodes == 5 == distinct_prefixes(ids, mask)
    assert pk.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 2, 0]]
    sees = (pk.bias[0, 0] == 0).int().tolist()
    assert sees == [[1, 0, 0, 0, 0],  # 5
                    [1, 1, 0, 0, 0],  # 6: after 5
                    [1, 1, 1, 0, 0],  # 7: after 5 6
                    [1, 1, 0, 1, 0],  # 8: after 5 6, not 7
                    [0, 0, 0, 0, 1]]  # 9: alone
    assert set(pk.bias.unique().tolist()) == {0.0, MIN}
    assert pk.node.tolist() == [[0, 1, 2], [4, -1, -1], [-1, -1, -1, 0, 1, 3][-3:]]


def test_a_full_pack_starts_a_new_one_and_repeats_the_prefix():
    ids, mask = _padded([[5, 6, 7], [9], [5, 6, 8]])
    pk = trie_pack(ids, mask, pack_tokens=3)
    # [5 6 7] fills pack 0; [5 6 8] would make it 4 nodes: pack 1 holds 5 6 8 again; [9]: pack 2
    assert pk.nodes == 7
    assert pk.input_ids.tolist() == [[5, 6, 7], [5, 6, 8], [9, 0, 0]]
    assert pk.position_ids.tolist() == [[0, 1, 2], [0, 1, 2], [0, 0, 0]]
    assert pk.node.tolist() == [[0, 1, 2], [6, -1, -1], [3, 4, 5]]
    # unused slots see only themselves
    assert (pk.bias[2, 0] == 0).int().tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match="pack_tokens is 0"):
        trie_pack(ids, mask, pack_tokens=0)


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=64)
    elif kind == "qwen2":  # q/k/v biases
        cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    else:  # not replayed by arborl.policy.tail: the padded path
        cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()  # no dropout: both paths see one model


def _tree_batch(seed: int):
    """A trunk and continuations from random turns of it, an unrelated row, a row equal to a prefix of another."""
    g = torch.Generator().manual_seed(seed)
    trunk = torch.randint(1, V, (24,), generator=g).tolist()
    rows = [trunk]
    for _ in range(6):
        cut = int(torch.randint(2, 20, (1,), generator=g))
        rows.append(trunk[:cut] + torch.randint(1, V, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist())
    rows.append(torch.randint(1, V, (9,), generator=g).tolist())
    rows.append(trunk[:10])
    ids, mask = _padded(rows, left={2, 5}, extra=2)
    positions = (torch.rand(ids.shape, generator=g) < 0.5).float() * mask
    positions[4] = 0.0  # a row with nothing to train
    return ids, mask, positions


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("pack_tokens", [1, 30, 512])
def test_packed_log_probs_entropies_and_gradients_equal_the_padded_path(kind, pack_tokens):
    model = _model(kind)
    ids, mask, positions = _tree_batch(pack_tokens)
    if kind != "gpt2":
        assert distinct_prefixes(ids, mask) < 0.6 * int(mask.sum())  # the rows really share
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for packed in (False, True):
        model.zero_grad()
        if packed:
            lp, ent = packed_token_logprobs_and_entropy(model, ids, mask, temperature=0.7, positions=positions,
                                                        pack_tokens=pack_tokens)
        else:
            lp, ent = token_logprobs_and_entropy(model, ids, mask, temperature=0.7, positions=positions)
        ((lp * weights).sum() + 0.1 * (ent * weights).sum()).backward()
        results.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    assert ((lp_b != 0) == (lp_a != 0)).all() and (lp_b[positions == 0] == 0).all()
    for a, b in zip(grad_a, grad_b, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    assert any(a.abs().max() > 0 for a in grad_a)


def test_a_wrong_positions_shape_is_refused():
    ids, mask, _ = _tree_batch(0)
    with pytest.raises(ValueError, match="positions shape"):
        packed_token_logprobs_and_entropy(_model("llama"), ids, mask, positions=torch.ones(2, 3))
