"""One RL update moves log-probs in the direction of the advantages, and only on trained tokens."""

import torch

from arborl.config import load_config
from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, run_episodes
from arborl.train.batch import broadcast, collate, step_batch
from arborl.train.config import TrainConfig
from arborl.train.rl import _update


def test_update_follows_advantage_sign():
    torch.manual_seed(0)
    env = FrozenLake(size=4)
    corpus = []
    for s in range(30):
        obs, _ = env.reset(seed=s)
        corpus.append(env.format_observation(obs))
    tok = train_tokenizer(corpus, extra_words=["Left", "Down", "Right", "Up"])
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2), tok, seed=0).eval()
    cfg = load_config(TrainConfig, None, ["rl.ppo_epochs=1", "rl.minibatch_size=16", "rl.lr=1e-3", "rl.kl_coef=0.0",
                                          "rollout.max_turns=3", "rollout.sampling.max_new_tokens=3"])
    specs = [EpisodeSpec(task_id="t", task_type="frozenlake", group_id=f"g{i // 4}", seed=i // 4) for i in range(16)]
    eps = run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: FrozenLake(size=4), specs, cfg.rollout,
                       generator=torch.Generator().manual_seed(0))
    batch = collate(eps)
    steps = step_batch(eps)
    # +1 for even episodes, -1 for odd ones, on every turn
    step_adv = torch.where(steps.episode % 2 == 0, 1.0, -1.0)
    adv = broadcast(step_adv, batch.step_of_token) * batch.loss_mask
    with torch.no_grad():
        before = token_logprobs(model, batch.input_ids, batch.attention_mask)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    terms = _update(model, opt, cfg, batch, adv, None, torch.Generator().manual_seed(0))
    assert terms["diag/clip_frac"] == 0.0  # first and only pass is exactly on-policy
    with torch.no_grad():
        after = token_logprobs(model, batch.input_ids, batch.attention_mask)
    d = after - before
    trained = batch.loss_mask > 0
    assert d[trained & (adv > 0)].mean() > 0 > d[trained & (adv < 0)].mean()
    assert (adv * d)[trained].sum() > 0


def test_branch_rollout_config_is_greedy_and_refuses_a_mismatched_temperature():
    import pytest

    from arborl.train.rl import _branch_rollout_config

    cfg = load_config(TrainConfig, None, ["rl.branch=true"])
    assert _branch_rollout_config(cfg).sampling.greedy and not cfg.rollout.sampling.greedy
    sampled = load_config(TrainConfig, None, ["rl.branch=true", "rl.branch_greedy=false"])
    assert _branch_rollout_config(sampled) is sampled.rollout
    # the cross-field rule is checked when the config is built, with the fix in the message
    from arborl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.sampling\.temperature = 1 or rl\.branch_greedy = false"):
        load_config(TrainConfig, None, ["rl.branch=true", "rollout.sampling.temperature=1.5"])
    ok = load_config(TrainConfig, None, ["rl.branch=true", "rl.branch_greedy=false", "rollout.sampling.temperature=1.5"])
    assert _branch_rollout_config(ok) is ok.rollout


def test_length_chunks_group_similar_lengths_and_cover_every_row():
    from arborl.train.batch import TokenBatch, length_chunks

    lengths = [5, 1, 9, 3, 7, 2]
    att = torch.zeros(6, 9, dtype=torch.long)
    for i, n in enumerate(lengths):
        att[i, :n] = 1
    zeros = torch.zeros(6, 9)
    batch = TokenBatch(att.clone(), att, zeros, zeros, torch.zeros(6, 9, dtype=torch.long))
    chunks = length_chunks(batch, 4)
    assert [c.tolist() for c in chunks] == [[1, 5, 3, 0], [4, 2]]


def test_rl_lr_warmup_then_cosine_hand_computed():
    from arborl.train.rl import rl_lr

    rc = load_config(TrainConfig, None, ["rl.lr=1.0", "rl.iterations=12", "rl.warmup_iters=2",
                                         "rl.lr_schedule=\"cosine\""]).rl
    lrs = [rl_lr(rc, it) for it in range(12)]
    assert lrs[:2] == [0.5, 1.0] and lrs[2] == 1.0
    assert abs(lrs[7] - 0.5) < 1e-9  # half-way through the 10 decaying iterations
    assert lrs[11] < 0.03
    flat = load_config(TrainConfig, None, ["rl.lr=1.0", "rl.warmup_iters=2"]).rl
    assert [rl_lr(flat, it) for it in range(4)] == [0.5, 1.0, 1.0, 1.0]


def _lengths_batch(lengths):
    from arborl.train.batch import TokenBatch

    att = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        att[i, :n] = 1
    zeros = torch.zeros(att.shape)
    return TokenBatch(att.clone(), att, zeros, zeros, torch.zeros(att.shape, dtype=torch.long))


def test_micro_chunks_cap_the_padded_size_of_each_piece_hand_computed():
    from arborl.train.batch import length_chunks, micro_chunks

    batch = _lengths_batch([5, 1, 9, 3, 7, 2])
    rows = length_chunks(batch, 6)[0]  # sorted by length: 1 2 3 5 7 9 (rows 1 5 3 0 4 2)
    # cap 8: [1, 2] is 2 x 2 = 4 (with 3 it would be 3 x 3 = 9); [3] + [5] would be 2 x 5 = 10; 9 > 8 alone
    assert [p.tolist() for p in micro_chunks(batch, rows, 8)] == [[1, 5], [3], [0], [4], [2]]
    # cap 12: [1, 2, 3] is 9, [5, 7] is 14 > 12, [7] then [7, 9] is 18 > 12
    assert [p.tolist() for p in micro_chunks(batch, rows, 12)] == [[1, 5, 3], [0], [4], [2]]
    assert [p.tolist() for p in micro_chunks(batch, rows, 0)] == [rows.tolist()]  # 0: unsplit
    assert [p.tolist() for p in micro_chunks(batch, rows, 10_000)] == [rows.tolist()]


def _rollout_batch():
    """A real FrozenLake batch of 16 episodes from a tiny random policy, with +-1 advantages."""
    env = FrozenLake(size=4)
    corpus = [env.format_observation(env.reset(seed=s)[0]) for s in range(30)]
    tok = train_tokenizer(corpus, extra_words=["Left", "Down", "Right", "Up"])
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2), tok, seed=0).eval()
    cfg = load_config(TrainConfig, None, ["rollout.max_turns=4", "rollout.sampling.max_new_tokens=3"])
    specs = [EpisodeSpec(task_id="t", task_type="frozenlake", group_id=f"g{i // 4}", seed=i // 4) for i in range(16)]
    eps = run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: FrozenLake(size=4), specs, cfg.rollout,
                       generator=torch.Generator().manual_seed(0))
    batch = collate(eps)
    steps = step_batch(eps)
    adv = broadcast(torch.where(steps.episode % 2 == 0, 1.0, -1.0), batch.step_of_token) * batch.loss_mask
    return model, batch, adv


def test_micro_batches_take_the_same_step_as_the_whole_minibatch():
    import copy

    from arborl.train.batch import length_chunks, micro_chunks

    torch.manual_seed(0)
    model, batch, adv = _rollout_batch()
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # a reference a little off the policy, so the KL term has a gradient too
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    from arborl.train.rl import _ref_logprobs

    ref_logp = _ref_logprobs(ref, batch, 8, 1.0)
    widths = batch.attention_mask.sum(-1)
    assert widths.min() < widths.max()  # the pieces differ in width: padding is really left out
    cap = int(widths.max()) * 2
    assert all(len(micro_chunks(batch, c, cap)) > 1 for c in length_chunks(batch, 8))
    results = []
    for extra in ([], [f"rl.micro_batch_tokens={cap}"]):
        cfg = load_config(TrainConfig, None, ["rl.ppo_epochs=2", "rl.minibatch_size=8", "rl.kl_coef=0.1",
                                              "rl.entropy_coef=0.01", *extra])
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        terms = _update(m, opt, cfg, batch, adv, ref_logp, torch.Generator().manual_seed(0))
        results.append((m, terms))
    (whole, t_whole), (split, t_split) = results
    for a, b in zip(whole.parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert any((a - b).abs().max() > 0 for a, b in zip(model.parameters(), whole.parameters(), strict=True))
    assert t_whole.keys() == t_split.keys()
    for k in ("loss/policy", "loss/kl", "loss/entropy", "diag/clip_frac", "diag/ratio_max", "grad_norm"):
        assert abs(t_whole[k] - t_split[k]) < 1e-4 * max(1.0, abs(t_whole[k])), k


def test_prefix_shared_update_takes_the_same_step_as_the_padded_one():
    """rl.prefix_share: each piece one pass over its prefix tree; the weights after two epochs (with KL and
    entropy terms, micro-batched or not) equal the padded update's to float rounding."""
    import copy

    from arborl.policy.packed import distinct_prefixes
    from arborl.train.batch import length_chunks
    from arborl.train.rl import _pieces, _ref_logprobs

    torch.manual_seed(0)
    model, batch, adv = _shared_batch()
    assert distinct_prefixes(batch.input_ids, batch.attention_mask) < 0.4 * int(batch.attention_mask.sum())
    # the cost rule packs these minibatches, whole and in pieces (else this test would compare the padded
    # path with itself)
    cap = int(batch.attention_mask.sum(-1).max()) * 2
    for c in length_chunks(batch, 16):
        assert all(pack for _, pack in _pieces(model, batch, c, 0, 64) + _pieces(model, batch, c, cap, 64))
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ref_logp = _ref_logprobs(ref, batch, 16, 1.0)
    torch.testing.assert_close(_ref_logprobs(ref, batch, 16, 1.0, prefix_share=64), ref_logp, atol=1e-5, rtol=1e-5)
    for micro in ([], [f"rl.micro_batch_tokens={cap}"]):
        results = []
        for extra in ([], ["rl.prefix_share=64"]):
            cfg = load_config(TrainConfig, None, ["rl.ppo_epochs=2", "rl.minibatch_size=16", "rl.kl_coef=0.1",
                                                  "rl.entropy_coef=0.01", *micro, *extra])
            m = copy.deepcopy(model)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            results.append((m, _update(m, opt, cfg, batch, adv, ref_logp, torch.Generator().manual_seed(0))))
        (padded, t_padded), (shared, t_shared) = results
        for a, b in zip(padded.parameters(), shared.parameters(), strict=True):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        assert any((a - b).abs().max() > 0 for a, b in zip(model.parameters(), padded.parameters(), strict=True))
        for k in ("loss/policy", "loss/kl", "loss/entropy", "diag/clip_frac", "grad_norm"):
            assert abs(t_padded[k] - t_shared[k]) < 1e-4 * max(1.0, abs(t_padded[k])), k


def _shared_batch(copies: int = 3):
    """:func:`_rollout_batch` with every row ``copies`` times (group members that played the same moves)."""
    from arborl.train.batch import TokenBatch

    model, batch, adv = _rollout_batch()
    fields = (batch.input_ids, batch.attention_mask, batch.loss_mask, batch.old_logp, batch.step_of_token)
    return model, TokenBatch(*(t.repeat(copies, 1) for t in fields)), adv.repeat(copies, 1)


def test_prefix_share_packs_only_where_it_costs_less():
    from arborl.train.batch import length_chunks
    from arborl.train.rl import _pieces

    torch.manual_seed(0)
    model, batch, _ = _rollout_batch()  # 16 rollouts that part after their first observation
    everything = torch.arange(len(batch.input_ids))
    padded = _pieces(model, batch, everything, 0, 0)
    assert [(p.tolist(), k) for p, k in padded] == [(everything.tolist(), 0)]  # off: one padded pass
    # on, with rows that share little: packed attention over masked pairs would cost more than padding
    assert all(k == 0 for c in length_chunks(batch, 8) for _, k in _pieces(model, batch, c, 0, 64))
    model, shared, _ = _shared_batch()
    pieces = _pieces(model, shared, torch.arange(len(shared.input_ids)), 0, 64)
    assert all(k > 0 for _, k in pieces)
    assert sorted(r for p, _ in pieces for r in p.tolist()) == list(range(len(shared.input_ids)))  # every row once


def test_prefix_chunks_sort_rows_and_cap_the_distinct_tokens_by_hand():
    from arborl.train.batch import TokenBatch, prefix_chunks

    rows = [[5, 6, 8], [9, 1], [5, 6, 7, 1], [5, 2]]
    ids = torch.zeros(4, 4, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = 1
    z = torch.zeros(4, 4)
    batch = TokenBatch(ids, mask, z, z, torch.zeros_like(ids))
    everything = torch.arange(4)
    # lexicographic: [5 2] (2 new), [5 6 7 1] (3 new), [5 6 8] (1 new), [9 1] (2 new)
    assert [p.tolist() for p in prefix_chunks(batch, everything, 0)] == [[3, 2, 0, 1]]
    assert [p.tolist() for p in prefix_chunks(batch, everything, 6)] == [[3, 2, 0], [1]]
    # cap 5: [5 2] + [5 6 7 1] is 5; [5 6 8] starts afresh (3), + [9 1] is 5
    assert [p.tolist() for p in prefix_chunks(batch, everything, 5)] == [[3, 2], [0, 1]]
    assert [p.tolist() for p in prefix_chunks(batch, everything, 1)] == [[3], [2], [0], [1]]


def test_micro_batch_tokens_is_checked():
    import pytest

    from arborl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rl\.micro_batch_tokens must be >= 0"):
        load_config(TrainConfig, None, ["rl.micro_batch_tokens=-1"])
    with pytest.raises(ConfigError, match=r"rl\.prefix_share must be >= 0"):
        load_config(TrainConfig, None, ["rl.prefix_share=-1"])



def test_micro_batches_leave_other_loss_aggregations_as_one_pass():
    # seq-mean aggregations normalise by rows or by the padded width, which a split would change:
    # there the option is inert, and the update is exactly the unsplit one
    import copy

    torch.manual_seed(0)
    model, batch, adv = _rollout_batch()
    results = []
    for extra in ([], ["rl.micro_batch_tokens=16"]):
        cfg = load_config(TrainConfig, None, ["rl.minibatch_size=8", "rl.kl_coef=0", 'rl.loss_agg="seq-mean-token-sum-norm"',
                                              *extra])
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        results.append((m, _update(m, opt, cfg, batch, adv, None, torch.Generator().manual_seed(0))))
    (whole, t_whole), (split, t_split) = results
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), split.parameters(), strict=True))
    assert t_whole == t_split
    assert any((a - b).abs().max() > 0 for a, b in zip(model.parameters(), whole.parameters(), strict=True))


def test_sft_micro_batches_give_the_gradient_of_the_whole_batch():
    """sft.micro_batch_tokens: length-sorted pieces, gradients accumulated = the whole batch's gradient."""
    import copy

    import pytest

    from arborl.config import ConfigError
    from arborl.train.batch import micro_chunks
    from arborl.train.sft import _step_gradients

    torch.manual_seed(0)
    model, batch, _ = _rollout_batch()
    model.train()
    widths = batch.attention_mask.sum(-1)
    assert widths.min() < widths.max()
    cap = int(widths.max()) * 2
    rows = torch.sort(widths, stable=True).indices
    assert len(micro_chunks(batch, rows, cap)) > 2
    grads, losses = [], []
    for tokens in (0, cap):
        m = copy.deepcopy(model)
        terms = _step_gradients(m, batch, tokens)
        grads.append([p.grad for p in m.parameters()])
        losses.append(terms["loss/sft"])
    assert all(g is not None and g.abs().max() > 0 for g in grads[0])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    with pytest.raises(ConfigError, match=r"sft\.micro_batch_tokens must be >= 0"):
        load_config(TrainConfig, None, ["sft.micro_batch_tokens=-1"])
