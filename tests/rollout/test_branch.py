"""Forced turns and branch rollouts: re-play reaches the trunk's state, every untried action is tried."""

from __future__ import annotations

import pytest
import torch

from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, ModelConfig, build_model, token_logprobs, train_tokenizer
from arborl.rollout import (
    EpisodeSpec,
    ModelPolicy,
    RolloutConfig,
    SamplingConfig,
    ScriptedPolicy,
    run_episodes,
)
from arborl.rollout.branch import branch_diverged, branch_specs, continuation_spec, credited_turns, own_turns
from arborl.rollout.kvcache import PrefixCache
from arborl.train.batch import collate, step_batch
from arborl.trajectory.schema import Origin, linearize

from .conftest import SYSTEM, WORDS, CountEnv

MAP = ["S_H_", "____", "_H__", "___G"]
DESC = [row.replace("_", "F") for row in MAP]


@pytest.fixture(scope="module")
def lake_policy():
    """A tiny random model whose tokenizer knows FrozenLake's words (so forced actions round-trip)."""
    env = FrozenLake(size=4)
    obs, _ = env.reset(options={"desc": DESC})
    tok = train_tokenizer([SYSTEM, " ".join(WORDS), " ".join(FrozenLake.actions), env.format_observation(obs)])
    model = build_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                                    max_position_embeddings=1024), tok, seed=0)
    return model, ChatRenderer(tok, SYSTEM)


def _cfg(max_turns: int = 6) -> RolloutConfig:
    return RolloutConfig(max_turns=max_turns, max_context_tokens=1000,
                         sampling=SamplingConfig(max_new_tokens=4, temperature=1.0), batch_size=16)


@pytest.mark.parametrize("kept", [True, False])
def test_a_branch_shares_its_trunks_prefix_and_its_log_probs_are_the_policys(model, renderer, kept):
    policy, cache = ModelPolicy(model, renderer), PrefixCache() if kept else None
    spec = EpisodeSpec(task_id="t", task_type="count", group_id="g", seed=3, options={"length": 4})
    (trunk,) = run_episodes(policy, CountEnv, [spec], _cfg(), generator=torch.Generator().manual_seed(0),
                            prefix_cache=cache)
    bspec = continuation_spec(trunk, 2, "branch", "go")
    (ep,) = run_episodes(policy, CountEnv, [bspec], _cfg(), generator=torch.Generator().manual_seed(1),
                         prefix_cache=cache)
    turns = ep.path()
    assert len(turns) == 4 and ep.origin == Origin(of=trunk.episode_id, turn=2, kind="branch", action="go",
                                                   state_key=trunk.path()[2].state_key)
    assert all(a is b for a, b in zip(turns[:2], trunk.path()[:2], strict=False))  # the trunk's turns, shared
    assert turns[2].parent_id == trunk.path()[1].turn_id and turns[2].index == 2
    assert turns[2].output_ids == renderer.encode_response("go") and all(turns[2].output_mask)
    assert turns[2].prompt_ids == trunk.path()[2].prompt_ids  # the re-played env reached the same state
    assert not branch_diverged(ep) and credited_turns(ep) == (2, 3)
    if kept:  # the trunk's row held every prefix token: none prefilled again
        assert cache.reused_tokens == sum(len(t.prompt_ids) + len(t.output_ids) for t in turns[:2])
        assert cache.prefilled_tokens == 0
    # the recorded log-probs of the forced and the sampled tokens are the policy's over the full path
    view = linearize(ep)
    with torch.no_grad():
        lp = token_logprobs(model, torch.tensor([view.input_ids]))[0]
    own = torch.tensor([i for i, t in enumerate(view.turn_index) if t >= 2 and view.loss_mask[i]])
    assert (lp[own] - torch.tensor(view.logprobs)[own]).abs().max() < 1e-4
    # trained on the forced action only; the shared prefix is context
    batch = collate([ep])
    trained = set(batch.loss_mask[0].nonzero()[:, 0].tolist())
    assert trained == {i for i, t in enumerate(view.turn_index) if t == 2 and view.loss_mask[i]}


def test_branches_try_every_untried_action_at_every_visited_state(lake_policy):
    model, renderer = lake_policy
    env = FrozenLake(size=4)
    spec = EpisodeSpec(task_id="m", task_type="frozenlake", group_id="g0", seed=5, options={"desc": DESC})
    trunks = run_episodes(ScriptedPolicy(lambda e: e.expert_action(), renderer), [env], [spec, spec], _cfg(10),
                          generator=torch.Generator().manual_seed(0))
    path = trunks[0].path()
    assert trunks[0].success and len(path) == 6  # shortest path on MAP
    specs = branch_specs(trunks, FrozenLake.actions)
    # two identical trunks visit 6 states; at each, 3 actions were not tried
    assert len(specs) == 6 * 3
    assert {(s.origin.turn, s.branch_action) for s in specs} == {
        (k, a) for k, t in enumerate(path) for a in FrozenLake.actions if a != t.action
    }
    branches = run_episodes(ModelPolicy(model, renderer), lambda: FrozenLake(size=4), specs, _cfg(10),
                            generator=torch.Generator().manual_seed(1))
    for spec_b, br in zip(specs, branches, strict=True):
        k = spec_b.origin.turn
        assert not branch_diverged(br)
        assert br.path()[k].state_key == path[k].state_key
        assert br.path()[k].action == spec_b.branch_action
        assert own_turns(br) == len(br.path()) - k  # the forced action and the policy's finish, not the re-play
    assert [own_turns(t) for t in trunks] == [6, 6]
    # shared prefix turns carry no credit and branches are not group samples
    steps = step_batch(trunks + branches)
    assert steps.sampled.tolist() == [True, True] + [False] * len(branches)
    k_of = [0] * 2 + [s.origin.turn for s in specs]
    expected = [k == k_of[e] if e >= 2 else True for e, k in zip(steps.episode.tolist(), steps.step.tolist(), strict=True)]
    assert steps.active.tolist() == expected
    # a branch is trained on its forced action only: its tensors stop after that turn
    batch = collate(trunks + branches)
    for e, br in enumerate(branches, start=2):
        k = br.origin.turn
        n = int(batch.attention_mask[e].sum())
        assert batch.input_ids[e, :n].tolist() == linearize(br).input_ids[:n]
        assert n == sum(len(t.prompt_ids) + len(t.output_ids) for t in br.path()[: k + 1])
        trained = batch.loss_mask[e].nonzero()[:, 0]
        assert trained.numel() == len(br.path()[k].output_ids)


def test_diverged_branch_is_detected_and_gets_no_credit(lake_policy):
    model, renderer = lake_policy
    spec = EpisodeSpec(task_id="m", task_type="frozenlake", group_id="g0", seed=5, options={"desc": DESC})
    trunks = run_episodes(ScriptedPolicy(lambda e: e.expert_action(), renderer), [FrozenLake(size=4)], [spec],
                          _cfg(10), generator=torch.Generator().manual_seed(0))
    bspec = branch_specs(trunks, FrozenLake.actions)[5]
    other = EpisodeSpec(**{**bspec.__dict__, "options": {"desc": ["SFFF", "FFFF", "FFFF", "FFFG"]}})
    (br,) = run_episodes(ModelPolicy(model, renderer), [FrozenLake(size=4)], [other], _cfg(10),
                         generator=torch.Generator().manual_seed(1))
    assert branch_diverged(br)
    assert own_turns(br) == len(br.path()) - bspec.origin.turn  # its steps were taken all the same
    steps = step_batch([br])
    assert not steps.active.any()


def test_branch_states_caps_the_branched_states_of_each_group(lake_policy):
    _, renderer = lake_policy
    env = FrozenLake(size=4)
    # two groups on the same map (seeds differ: a trunk equal in content to an earlier one is not branched)
    specs = [EpisodeSpec(task_id="m", task_type="frozenlake", group_id=g, seed=seed, options={"desc": DESC})
             for g, seed in (("g0", 5), ("g0", 5), ("g1", 6))]
    trunks = run_episodes(ScriptedPolicy(lambda e: e.expert_action(), renderer), [env], specs, _cfg(10),
                          generator=torch.Generator().manual_seed(0))
    path = trunks[0].path()  # the expert's 6 states, the same in both groups
    full = branch_specs(trunks, FrozenLake.actions)
    assert len(full) == 2 * 6 * 3
    capped = branch_specs(trunks, FrozenLake.actions, max_states=2, generator=torch.Generator().manual_seed(0))
    # 2 states of each group, every untried action at each: 2 groups x 2 states x 3 actions
    assert len(capped) == 2 * 2 * 3
    for g in ("g0", "g1"):
        mine = [s for s in capped if s.group_id == g]
        assert len({s.origin.turn for s in mine}) == 2
        for k in {s.origin.turn for s in mine}:
            assert {s.branch_action for s in mine if s.origin.turn == k} == \
                {a for a in FrozenLake.actions if a != path[k].action}
    # a subset of the full list, in its order; the same generator seed picks the same states
    assert [(s.group_id, s.origin.turn, s.branch_action) for s in capped] == \
        [(s.group_id, s.origin.turn, s.branch_action) for s in full
         if (s.group_id, s.origin.turn) in {(c.group_id, c.origin.turn) for c in capped}]
    again = branch_specs(trunks, FrozenLake.actions, max_states=2, generator=torch.Generator().manual_seed(0))
    assert [(s.group_id, s.origin.turn) for s in again] == [(s.group_id, s.origin.turn) for s in capped]
    # a cap at or above the states visited branches them all
    assert len(branch_specs(trunks, FrozenLake.actions, max_states=6, generator=torch.Generator())) == len(full)
    with pytest.raises(ValueError, match="torch.Generator"):
        branch_specs(trunks, FrozenLake.actions, max_states=2)
    with pytest.raises(ValueError, match="max_states"):
        branch_specs(trunks, FrozenLake.actions, max_states=-1)
