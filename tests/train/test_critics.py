"""Turn-PPO's and ArCHer's critics on a real tiny policy, real FrozenLake rollouts and a real SQLite store."""

import io

import pytest
import torch

from arborl.config import load_config
from arborl.critics.archer import ArcherCritic, soft_update, td_targets
from arborl.critics.features import hidden_at, trunk_of, turn_positions
from arborl.critics.turn_ppo import TurnCritic
from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, run_episodes
from arborl.store.sqlite import SQLiteStore
from arborl.train.batch import collate, step_batch
from arborl.train.config import TrainConfig
from arborl.train.credit_models import CreditContext
from arborl.trajectory import Episode, Turn


@pytest.fixture(scope="module")
def policy():
    env = FrozenLake(size=4)
    corpus = [env.format_observation(env.reset(seed=s)[0]) for s in range(30)]
    tok = train_tokenizer(corpus, extra_words=["Left", "Down", "Right", "Up"])
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2), tok, seed=0)
    return model.eval(), tok


def config(*extra):
    return load_config(TrainConfig, None, ["rollout.max_turns=3", "rollout.sampling.max_new_tokens=3", "rl.gamma=0.9",
                                           *extra])


@pytest.fixture()
def rolled(policy, tmp_path):
    model, tok = policy
    cfg = config()
    specs = [EpisodeSpec(task_id="t", task_type="frozenlake", group_id=f"g{i // 4}", seed=i // 4) for i in range(8)]
    eps = run_episodes(ModelPolicy(model, ChatRenderer(tok)), lambda: FrozenLake(size=4), specs, cfg.rollout,
                       generator=torch.Generator().manual_seed(0), iteration=0, source="rl")
    store = SQLiteStore(tmp_path / "store.db")
    episodes = store.get_many(store.put_many(eps))
    yield episodes, store
    store.close()


def context(cfg, policy, episodes, store, it=0):
    model, tok = policy
    return CreditContext(cfg, it, episodes, step_batch(episodes), collate(episodes), model, tok, store)


def params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def saved(state):
    """``state`` through torch.save / torch.load, as a checkpoint's trainer_state.pt holds it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- Turn-PPO ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["head", "separate"])
def test_turn_critic_fits_its_targets_and_never_changes_the_policy(policy, rolled, kind):
    episodes, store = rolled
    cfg = config("rl.credit=turn_ppo", f"rl.critic={kind}", "rl.critic_epochs=30", "rl.critic_lr=1e-2",
                 "rl.value_clip=0")
    critic = TurnCritic(cfg, policy[0], policy[1])
    before = params(policy[0])
    ctx = context(cfg, policy, episodes, store)
    extra = critic.step_inputs(ctx)
    assert extra["values"].shape == (ctx.steps.episode.numel(),)
    assert extra["episode_truncated"].tolist() == [ep.stop_reason == "max_turns" for ep in episodes]
    first = critic.fit(ctx)
    last = critic.fit(ctx)
    assert last["critic/loss"] < 0.5 * first["critic/loss"]
    assert same(before, params(policy[0]))  # the critic reads the policy and never trains it
    if kind == "separate":  # its own body moved away from the policy's
        assert not same(params(trunk_of(policy[0])), params(critic.trunk))


def test_a_turns_value_reads_its_state_and_not_its_action(policy, rolled):
    # V(s_h) is read at the last prompt token of turn h: changing turn 0's output leaves V(s_0) and changes V(s_1)
    episodes, store = rolled
    ep = next(e for e in episodes if len(e.path()) >= 2)
    cfg = config("rl.credit=turn_ppo")
    critic = TurnCritic(cfg, *policy)
    v = critic.step_inputs(context(cfg, policy, [ep], store))["values"]
    pos = turn_positions(ep.path())
    h = hidden_at(trunk_of(policy[0]), [pos.ids], [pos.state])[0]
    with torch.no_grad():
        assert torch.allclose(v, critic.head(h).squeeze(-1), atol=1e-6)
    edited = Episode.from_dict(ep.to_dict())
    first = edited.path()[0]
    first.output_ids = [first.output_ids[0]] + first.output_ids
    first.output_logprobs, first.output_mask = [0.0] + first.output_logprobs, [1] + first.output_mask
    v2 = critic.step_inputs(context(cfg, policy, [edited], store))["values"]
    assert torch.allclose(v2[0], v[0], atol=1e-6) and not torch.allclose(v2[1], v[1], atol=1e-6)


def test_turn_critic_state_restores_an_exact_continuation(policy, rolled):
    episodes, store = rolled
    cfg = config("rl.credit=turn_ppo", "rl.critic_epochs=2", "rl.critic_minibatch=3")
    a = TurnCritic(cfg, *policy)
    ctx = context(cfg, policy, episodes, store)
    a.step_inputs(ctx)
    a.fit(ctx)
    b = TurnCritic(config("rl.credit=turn_ppo", "rl.critic_epochs=2", "rl.critic_minibatch=3", "seed=5"), *policy)
    b.load_state_dict(saved(a.state_dict()))
    va, vb = a.step_inputs(ctx)["values"], b.step_inputs(ctx)["values"]
    assert torch.equal(va, vb)
    assert a.fit(ctx) == b.fit(ctx)  # same minibatch order, same optimizer state


# ---- ArCHer ------------------------------------------------------------------------------------

def test_soft_update_by_hand():
    online, target = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        online.weight.fill_(1.0), online.bias.fill_(-2.0), target.weight.fill_(0.0), target.bias.fill_(0.0)
    soft_update(target, online, 0.1)
    assert torch.allclose(target.weight, torch.full((1, 2), 0.1)) and torch.allclose(target.bias, torch.tensor([-0.2]))
    soft_update(target, online, 0.1)  # 0.9 * 0.1 + 0.1 * 1 = 0.19
    assert torch.allclose(target.weight, torch.full((1, 2), 0.19)) and torch.allclose(target.bias, torch.tensor([-0.38]))
    assert torch.equal(online.weight, torch.ones(1, 2))  # the online network is not touched


def test_td_target_by_hand():
    y = td_targets(torch.tensor([0.0, 1.0, 0.5]), torch.tensor([0.5, 9.0, 2.0]), torch.tensor([False, True, False]), 0.9)
    assert torch.allclose(y, torch.tensor([0.45, 1.0, 2.3]))


def two_turn_episode(tok, stop_reason):
    """Two hand-built turns: reward 0 then 1."""
    ids = tok.convert_tokens_to_ids
    turns = []
    for k, (prompt, out, r) in enumerate([(["Left", "Down"], ["Up"], 0.0), (["Right"], ["Down", "Left"], 1.0)]):
        turns.append(Turn(turn_id=f"t{k}", parent_id=f"t{k - 1}" if k else None, index=k, prompt_ids=ids(prompt),
                          output_ids=ids(out), output_logprobs=[-1.0] * len(out), output_mask=[1] * len(out),
                          reward=r, terminated=stop_reason == "terminated" and k == 1,
                          truncated=stop_reason == "max_turns" and k == 1))
    return Episode(task_id="hand", task_type="frozenlake", group_id="g", seed=0, turns=turns,
                   rewards={"success": 1.0}, stop_reason=stop_reason, iteration=0, source="rl")


@pytest.mark.parametrize("stop", ["terminated", "max_turns"])
def test_replay_reads_turns_from_the_store_and_builds_td_targets(policy, tmp_path, stop):
    model, tok = policy
    cfg = config("rl.credit=archer", "rl.critic_minibatch=64")
    critic = ArcherCritic(cfg, model, tok)
    with SQLiteStore(tmp_path / "s.db") as store:
        ep = two_turn_episode(tok, stop)
        (eid,) = store.put_many([ep])
        critic.replay = [[(eid, 2)]]
        # the context holds no episode: everything the sample has comes from the store
        s, a, r, s_next, done = critic.sample(CreditContext(cfg, 1, [], None, None, model, tok, store))
    pos = turn_positions(ep.path())
    h = hidden_at(trunk_of(model), [pos.ids], [[*pos.state, *pos.action, len(pos.ids) - 1]])[0]
    h_s, h_a, h_end = h[:2], h[2:4], h[4]
    first = r == 0.0
    assert 0 < int(first.sum()) < 64  # both turns were drawn
    assert torch.allclose(s[first], h_s[0].expand_as(s[first]), atol=1e-5)
    assert torch.allclose(a[~first], h_a[1].expand_as(a[~first]), atol=1e-5)
    assert torch.allclose(s_next[first], h_s[1].expand_as(s_next[first]), atol=1e-5)  # s' of turn 0 is turn 1's state
    assert not done[first].any()
    if stop == "terminated":
        assert done[~first].all()
    else:  # cut by the turn budget: bootstrapped from the state at the episode's last token
        assert not done[~first].any() and torch.allclose(s_next[~first], h_end.expand_as(s_next[~first]), atol=1e-5)
    with torch.no_grad():
        y = td_targets(r, critic.target.value(s_next), done, 0.9)
        v1, v_end = critic.target.value(h_s[1:2])[0], critic.target.value(h_end[None])[0]
    assert torch.allclose(y[first], 0.9 * v1, atol=1e-5)
    assert torch.allclose(y[~first], torch.tensor(1.0) + (0.9 * v_end if stop == "max_turns" else 0.0), atol=1e-5)


def test_archer_fit_learns_keeps_a_bounded_replay_and_restores_exactly(policy, rolled):
    episodes, store = rolled
    cfg = config("rl.credit=archer", "rl.critic_epochs=40", "rl.critic_lr=1e-2", "rl.archer_replay_iters=2",
                 "rl.critic_minibatch=16")
    critic = ArcherCritic(cfg, *policy)
    before = params(policy[0])
    ctx = context(cfg, policy, episodes, store)
    extra = critic.step_inputs(ctx)
    assert set(extra) == {"q_values", "values"} and extra["values"].shape == (ctx.steps.episode.numel(),)
    first = critic.fit(ctx)
    target_before = params(critic.target)
    for _ in range(2):
        last = critic.fit(ctx)
    assert last["critic/q1_loss"] < first["critic/q1_loss"] and last["critic/v_loss"] < first["critic/v_loss"]
    assert len(critic.replay) == 2  # the oldest iteration left the buffer
    assert not same(target_before, params(critic.target))  # soft-updated
    assert same(before, params(policy[0]))
    twin = ArcherCritic(config("rl.credit=archer", "rl.critic_epochs=40", "rl.critic_lr=1e-2",
                               "rl.archer_replay_iters=2", "rl.critic_minibatch=16", "seed=3"), *policy)
    twin.load_state_dict(saved(critic.state_dict()))
    assert critic.fit(ctx) == twin.fit(ctx)


def test_archer_replays_a_duplicate_rollout_written_in_the_background(policy, tmp_path):
    """Two identical rollouts in one group: the store keeps one copy, under the first one's id.

    The trainer holds both in memory (rl.async_store), so the replay must keep the stored id:
    the second one's own id names nothing in the store.
    """
    from arborl.train.writer import BackgroundWriter, readable
    from arborl.trajectory.canonical import content_hash

    model, tok = policy
    cfg = config("rl.credit=archer", "rl.critic_minibatch=16")
    critic = ArcherCritic(cfg, model, tok)
    first = two_turn_episode(tok, "terminated")
    twin = Episode.from_dict({**first.to_dict(), "episode_id": "twin-of-first"})
    assert twin.episode_id != first.episode_id and content_hash(twin) == content_hash(first)
    with SQLiteStore(tmp_path / "s.db") as store:
        with BackgroundWriter(store) as writer:
            writer.put([first, twin])
            ctx = context(cfg, policy, [first, twin], readable(writer))
            metrics = critic.fit(ctx)  # before: EpisodeNotFound('twin-of-first')
            assert writer.aliases == {"twin-of-first": first.episode_id}
            assert ctx.store.slice("twin-of-first") == store.slice(first.episode_id)
        assert store.count() == 1
    assert critic.replay[-1] == [(first.episode_id, 2), (first.episode_id, 2)]
    assert metrics["critic/replay_turns"] == 4.0


def test_hidden_states_at_positions_equal_the_whole_trunks(policy):
    """The critics' features (last layer only at the wanted positions) are the trunk's own outputs there."""
    trunk = trunk_of(policy[0])
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, 40, (n,), generator=g).tolist() for n in (23, 9, 30)]
    positions = [[0, 4, 4, 22], [8], [3, 17, 29]]  # a repeated position, a last one, a whole row's last
    with torch.no_grad():
        got = hidden_at(trunk, seqs, positions)
        for s, p, h in zip(seqs, positions, got, strict=True):
            ids = torch.tensor([s])
            full = trunk(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state[0]
            torch.testing.assert_close(h, full[p], atol=1e-5, rtol=1e-5)
