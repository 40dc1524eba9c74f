"""Training from the in-memory episodes, and writing them in the background.

The trainer no longer reads back what it just stored: the batch it builds from the episodes in
memory must equal the batch a read-back gives (SQLite, and a codec round trip), and the
background writer must store everything, in order, and surface a failed write.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, ModelConfig, build_model, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.branch import branch_specs
from arborl.store import open_store
from arborl.train.batch import collate, step_batch
from arborl.train.writer import BackgroundWriter, store_episodes
from arborl.trajectory import Episode, SchemaError


@pytest.fixture(scope="module")
def rolled():
    """A real RL iteration's episodes on FrozenLake: 3 maps x 3 group members, then every branch."""
    torch.set_num_threads(1)
    env = FrozenLake(size=4)
    obs, _ = env.reset(seed=0)
    tok = train_tokenizer([" ".join(FrozenLake.actions), env.format_observation(obs), "0 1 2 3 c0 c1 c2 c3 P G H _"])
    model = build_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                                    max_position_embeddings=1024), tok, seed=0)
    policy = ModelPolicy(model, ChatRenderer(tok, None))
    cfg = RolloutConfig(max_turns=4, sampling=SamplingConfig(max_new_tokens=3), batch_size=16)
    gen = torch.Generator().manual_seed(0)
    specs = [EpisodeSpec(f"m{s}", "frozenlake", f"g{s}", seed=s) for s in range(3) for _ in range(3)]
    eps = run_episodes(policy, lambda: FrozenLake(size=4), specs, cfg, generator=gen, source="rl")
    branches = branch_specs(eps, list(FrozenLake.actions))
    assert branches
    return eps + run_episodes(policy, lambda: FrozenLake(size=4), branches, cfg, generator=gen, source="rl-branch")


def _trained(episodes):
    batch = collate(episodes, pad_id=0)
    steps = step_batch(episodes, score_key="success", invalid_penalty=-1.0)
    return {**{f"batch.{k}": v for k, v in vars(batch).items()}, **{f"steps.{k}": v for k, v in vars(steps).items()}}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_the_batch_trained_from_memory_equals_the_sqlite_read_back(rolled, tmp_path):
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        back = store.get_many(store.put_many(rolled))
    assert len(back) == len(rolled) and any(e.origin is not None for e in back)
    _assert_same(_trained(rolled), _trained(back))


def test_the_batch_trained_from_memory_equals_a_codec_round_trip(rolled):
    back = [Episode.from_dict(json.loads(json.dumps(e.to_dict()))) for e in rolled]
    _assert_same(_trained(rolled), _trained(back))


def test_the_background_writer_stores_every_batch_in_order(rolled, tmp_path):
    with open_store(f"sqlite:///{tmp_path}/w.db") as store:
        with BackgroundWriter(store, max_pending=1) as writer:
            for i in range(0, len(rolled), 5):
                assert store_episodes(writer, rolled[i:i + 5]) == rolled[i:i + 5]  # trained as they are
        assert writer.written == len(rolled)
        assert store.count() == len(rolled)
        got = store.get_many([e.episode_id for e in rolled])
    _assert_same(_trained(rolled), _trained(got))


def test_a_failed_write_is_raised_at_the_next_put_and_at_flush(rolled, tmp_path):
    bad = Episode.from_dict(rolled[0].to_dict())
    bad.turns[0].output_logprobs[0] = float("nan")  # the store's validation refuses it
    with open_store(f"sqlite:///{tmp_path}/e.db") as store:
        writer = BackgroundWriter(store)
        writer.put([bad])
        writer._queue.join()  # the write has run (and failed) in the background
        with pytest.raises(SchemaError):
            writer.put(rolled[1:3])
        writer.put([bad])
        with pytest.raises(SchemaError):
            writer.flush()
        writer.flush()  # reported once
        writer.close()
        with pytest.raises(RuntimeError, match="writer is closed"):
            writer.put(rolled[:1])
        assert store.count() == 0


def test_the_queue_is_bounded(rolled, tmp_path):
    gate, entered = threading.Event(), threading.Event()

    class SlowStore:  # a real store behind a gate, so the writer thread is held mid-write
        def __init__(self, inner):
            self.inner = inner

        def put_many(self, eps):
            entered.set()
            gate.wait(5)
            return self.inner.put_many(eps)

    with open_store(f"sqlite:///{tmp_path}/b.db") as inner:
        writer = BackgroundWriter(SlowStore(inner), max_pending=1)
        writer.put(rolled[:1])  # taken by the thread, which now waits at the gate
        assert entered.wait(5)
        writer.put(rolled[1:2])  # fills the one queue slot
        third = threading.Thread(target=writer.put, args=(rolled[2:3],))
        third.start()
        third.join(0.3)
        assert third.is_alive()  # blocked: the queue holds max_pending batches
        gate.set()
        third.join(5)
        writer.flush()
        writer.close()
        assert inner.count() == 3
