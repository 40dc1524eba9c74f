"""The explicit PRM: Monte-Carlo targets by hand, named dimensions, and what training changes."""

import copy

import pytest
import torch
from conftest import context, success_gap, with_rl

from arborl.config import ConfigError
from arborl.prm.common import last_token_of_steps
from arborl.prm.explicit import (
    ExplicitPRM,
    dimension_targets,
    mc_targets,
    query_quality,
    resolve_dimensions,
    tool_choice,
    use_of_information,
)
from arborl.store import open_store
from arborl.train.batch import collate
from arborl.trajectory import Episode
from arborl.trajectory.schema import ToolCall, Turn


def episode(seed, moves, success, task="t"):
    """An episode whose turn k acted from state s_k with action moves[k]; scored ``success``."""
    ep = Episode(task_id=task, seed=seed, rewards={"success": float(success)})
    parent = None
    for k, a in enumerate(moves):
        parent = ep.add_turn(Turn(turn_id=f"{k}", parent_id=parent, index=k, state_key=f"s{k}-{moves[:k]}",
                                  action_text=a)).turn_id
    return ep


def test_mc_targets_by_hand():
    # won and lost share step 0 (same state, same action), then part ways. gamma = 0.5, T = 2:
    # step 0 contributes +-0.5 (one step to go), step 1 +-1; the shared prefix averages to 0 -> label 0.5
    won, lost = episode(1, ["a", "b"], 1), episode(1, ["a", "c"], 0)
    other = episode(2, ["a"], 0)  # another seed: its prefix is its own even with the same action
    assert mc_targets([won, lost, other], gamma=0.5) == [[0.5, 1.0], [0.5, 0.0], [0.0]]
    # alone, each path gets its own discounted outcome: (0.5 + 1) / 2 = 0.75 at step 0
    assert mc_targets([won], gamma=0.5) == [[0.75, 1.0]]


def test_tool_dimensions_by_hand():
    search = Turn(turn_id="0", action_text="search", tool_call=ToolCall("search", {"query": "capital of peru"}),
                  result="Lima is the capital of Peru.")
    empty = Turn(turn_id="1", action_text="search", tool_call=ToolCall("search", {"query": "zzz"}), result="")
    bad = Turn(turn_id="2", action_text="???", valid=False)
    uses, ignores = Turn(turn_id="3", action_text="answer: lima"), Turn(turn_id="4", action_text="answer: quito")
    assert [tool_choice([t], 0, 0.8) for t in (search, bad, uses)] == [0.8, 0.0, None]
    assert [query_quality([t], 0, 0.8) for t in (search, empty, uses)] == [0.8, 0.0, None]
    assert use_of_information([search, uses], 1, 0.8) == 0.8
    assert use_of_information([search, ignores], 1, 0.8) == 0.0
    assert use_of_information([uses], 0, 0.8) is None  # no tool result before it
    ep = Episode(task_id="q", rewards={"success": 1.0})
    for k, t in enumerate((search, uses)):
        t.index, t.parent_id = k, None if k == 0 else search.turn_id
        ep.add_turn(t)
    dims = resolve_dimensions(["progress", "tool_choice", "use_of_information"])
    y = dimension_targets([ep], [[0.6, 0.9]], dims)
    assert y[0].tolist() == pytest.approx([0.6, 0.6, float("nan")], nan_ok=True)
    assert y[1].tolist() == pytest.approx([0.9, float("nan"), 0.9], nan_ok=True)


def test_a_dimension_may_be_a_function_of_your_own_and_a_bad_name_is_refused():
    assert list(resolve_dimensions(["arborl.prm.explicit:progress"])) == ["progress"]
    with pytest.raises(ConfigError, match="rl.prm_dimensions"):
        resolve_dimensions(["no_such_dimension"])


def test_training_changes_the_scorer_and_ranks_successful_paths_higher(lake):
    cfg, policy, tok, url, episodes = lake
    cfg = with_rl(cfg, prm_lr=3e-3, prm_epochs=8, prm_minibatch_size=8)
    prm = ExplicitPRM(cfg, policy, tok)
    with open_store(url) as store:
        ctx = context(cfg, policy, tok, store, episodes)
        before = prm.step_inputs(ctx)["step_scores"]
        weights = copy.deepcopy(prm.model.state_dict())
        assert torch.all(before == 0.5)  # zero-initialised head: no opinion yet
        metrics = prm.fit(ctx)
        after = prm.step_inputs(ctx)["step_scores"]
    # the store keeps one copy of identical episodes (the two experts of a map): it trains on the distinct ones
    distinct = {e.episode_id: e for e in episodes}
    assert metrics["prm/episodes"] == len(distinct) < len(episodes)
    assert metrics["prm/labelled_steps"] == sum(len(e.path()) for e in distinct.values())
    assert any(not torch.equal(weights[k], v) for k, v in prm.model.state_dict().items())
    assert not torch.allclose(before, after)
    assert success_gap(before, ctx) == 0.0
    assert success_gap(after, ctx) > 0.1, success_gap(after, ctx)
    named = prm.named_step_rewards(ctx)
    assert list(named) == ["progress"] and torch.allclose(named["progress"], after)


def test_fit_reads_only_the_window_of_iterations_from_the_store(lake):
    cfg, policy, tok, url, episodes = lake
    prm = ExplicitPRM(cfg, policy, tok)
    with open_store(url) as store:
        # the stored episodes are from iteration 0; at iteration 10 with a window of 4 none is recent enough
        assert prm.fit(context(cfg, policy, tok, store, episodes, iteration=10)) == {"prm/episodes": 0.0}
        read = prm.training_episodes(context(cfg, policy, tok, store, episodes, iteration=3))
        assert sorted(e.episode_id for e in read) == sorted({e.episode_id for e in episodes})


def test_state_dict_round_trip(lake):
    cfg, policy, tok, url, episodes = lake
    a, b = ExplicitPRM(cfg, policy, tok), ExplicitPRM(cfg, policy, tok)
    with open_store(url) as store:
        a.fit(context(cfg, policy, tok, store, episodes))
        b.load_state_dict(a.state_dict())
        ctx = context(cfg, policy, tok, store, episodes)
        assert torch.equal(a.step_inputs(ctx)["step_scores"], b.step_inputs(ctx)["step_scores"])


def test_step_logits_read_each_steps_last_token_of_the_whole_backbone(lake):
    """The scorer's last layer runs only at steps' last tokens; its logits equal the full forward's there."""
    cfg, model, tok, _, episodes = lake
    prm = ExplicitPRM(with_rl(cfg, credit="prm"), model, tok)
    torch.nn.init.normal_(prm.model.head.weight, generator=torch.Generator().manual_seed(0))
    batch = collate(episodes)
    n = int(batch.step_of_token.max()) + 1
    with torch.no_grad():
        logits, present = prm.model.step_logits(batch, n)
        mask = batch.attention_mask.long()
        hidden = prm.model.backbone.base_model(input_ids=batch.input_ids, attention_mask=mask,
                                               position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                                               use_cache=False).last_hidden_state
        last = last_token_of_steps(batch.step_of_token, n)
        full = prm.model.head(hidden.reshape(-1, hidden.shape[-1])[last[present]].float())
    assert len(present) > 4
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
