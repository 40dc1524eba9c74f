"""Tree rollouts: continuations re-sampled from turns of a group, sharing the trunk's turns and KV cache."""

from __future__ import annotations

import pytest
import torch

from arborl.policy import token_logprobs
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.branch import own_turns
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.tree import tree_specs, turn_entropy
from arborl.store import open_store
from arborl.train.batch import collate, step_batch
from arborl.trajectory import Episode, Turn, linearize

from .conftest import CountEnv


def _cfg() -> RolloutConfig:
    return RolloutConfig(max_turns=6, max_context_tokens=1000,
                         sampling=SamplingConfig(max_new_tokens=4, temperature=1.0), batch_size=16)


def _trunks(policy, cache, n=3, seed=0):
    specs = [EpisodeSpec(task_id="t", task_type="count", group_id="g", seed=3, options={"length": 4})] * n
    return run_episodes(policy, CountEnv, specs, _cfg(), generator=torch.Generator().manual_seed(seed),
                        prefix_cache=cache)


def _hand_episode(eid: str, lps: list[list[float]], group: str = "g") -> Episode:
    ep = Episode(episode_id=eid, group_id=group, seed=1)
    parent = None
    for k, lp in enumerate(lps):
        t = ep.add_turn(Turn(turn_id=f"{eid}{k}", parent_id=parent, index=k, output_ids=[1] * len(lp),
                             output_logprobs=lp, output_mask=[1] * len(lp)))
        parent = t.turn_id
    return ep


def test_entropy_picks_the_least_sure_turns_and_uniform_picks_distinct_ones():
    a = _hand_episode("a", [[-0.1, -0.1], [-2.0, -1.0], [-0.5]])
    b = _hand_episode("b", [[-3.0], [-0.2, -0.2]])
    c = _hand_episode("c", [[-9.0]], group="h")
    assert turn_entropy(a.turns[1]) == 1.5
    specs = tree_specs([a, b, c], k=2, nodes=2, select="entropy", generator=torch.Generator())
    # group g: b's turn 0 (3.0), then a's turn 1 (1.5); group h: its only turn; two continuations each
    assert [(s.origin.of, s.origin.turn) for s in specs] == [("b", 0)] * 2 + [("a", 1)] * 2 + [("c", 0)] * 2
    assert all(s.origin.kind == "tree" and s.branch_action is None for s in specs)
    assert specs[2].prefix == (a.turns[0],)  # the trunk's turn itself, not a copy
    uni = tree_specs([a, b, c], k=1, nodes=4, select="uniform", generator=torch.Generator().manual_seed(0))
    picked = [(s.origin.of, s.origin.turn) for s in uni]
    assert len(picked) == 5 and len(set(picked)) == 5  # 4 of g's 5 turns, all of h's 1, no repeats
    with pytest.raises(ValueError, match="k >= 1"):
        tree_specs([a], k=0, nodes=1, select="uniform", generator=torch.Generator())


@pytest.mark.parametrize("kept", [True, False])
def test_tree_continuations_share_the_prefix_and_their_log_probs_are_the_policys(model, renderer, tmp_path, kept):
    policy, cache = ModelPolicy(model, renderer), PrefixCache() if kept else None
    trunks = _trunks(policy, cache)
    specs = tree_specs(trunks, k=2, nodes=3, select="uniform", generator=torch.Generator().manual_seed(2))
    conts = run_episodes(policy, CountEnv, specs, _cfg(), generator=torch.Generator().manual_seed(1),
                         prefix_cache=cache, source="rl-tree")
    by_id = {t.episode_id: t for t in trunks}
    shared = 0
    for ep in conts:
        k, trunk = ep.origin.turn, by_id[ep.origin.of]
        assert all(a is b for a, b in zip(ep.path()[:k], trunk.path()[:k], strict=False))
        assert ep.path()[k].prompt_ids == trunk.path()[k].prompt_ids  # re-sampled from the same state
        shared += sum(len(t.prompt_ids) + len(t.output_ids) for t in ep.path()[:k])
        # rollout log-probs of the continuation = recomputed over the full path
        view = linearize(ep)
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([view.input_ids]))[0]
        own = torch.tensor([i for i, t in enumerate(view.turn_index) if t >= k and view.loss_mask[i]])
        assert (lp[own] - torch.tensor(view.logprobs)[own]).abs().max() < 1e-4
    assert shared > 0
    if kept:  # every shared token came from a trunk's kept row: prefill saved in full
        assert (cache.reused_tokens, cache.prefilled_tokens) == (shared, 0)
    # stored as one tree: each prefix turn once, and reads give the full paths back
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        store.put_many(trunks + conts)
        rows = sum(store.index_row(e.episode_id).n_nodes for e in trunks + conts)
        assert rows == sum(len(t.turns) for t in trunks) + sum(len(c.path()) - c.origin.turn for c in conts)
        # env steps of experience: each stored turn once; the prefixes the env re-played are counted apart
        assert sum(own_turns(e) for e in trunks + conts) == rows
        assert sum(len(e.path()) - own_turns(e) for e in conts) == sum(c.origin.turn for c in conts) > 0
        back = store.get_many([e.episode_id for e in trunks + conts])
    assert back == trunks + conts
    # credit structure: a shared turn is one node, a continuation trains on its own turns only
    steps = step_batch(back)
    assert int(steps.parent.numel()) == rows
    batch = collate(back)
    for e, ep in enumerate(back[len(trunks):], start=len(trunks)):
        view = linearize(ep)
        want = {i for i, t in enumerate(view.turn_index) if t >= ep.origin.turn and view.loss_mask[i]}
        assert set(batch.loss_mask[e].nonzero()[:, 0].tolist()) == want


def test_a_copy_of_an_earlier_trunk_is_not_expanded_so_every_continuation_names_a_stored_trunk(tmp_path):
    a = _hand_episode("a", [[-1.0], [-2.0]])
    copy = _hand_episode("b", [[-1.0], [-2.0]])
    copy.turns[0].turn_id, copy.turns[1].turn_id, copy.turns[1].parent_id = "x", "y", "x"  # other ids, same content
    specs = tree_specs([a, copy], k=1, nodes=4, select="uniform", generator=torch.Generator())
    assert {s.origin.of for s in specs} == {"a"}
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        assert store.put_many([a, copy]) == ["a", "a"]  # the store keeps the first of equal contents
