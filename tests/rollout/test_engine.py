"""run_episodes: logprob invariant, kept-cache == re-prefill, batched == unbatched, masks, errors."""

from __future__ import annotations

import pytest
import torch

from arborl.env.base import StepResult
from arborl.policy import token_logprobs
from arborl.rollout import (
    EpisodeSpec,
    ModelPolicy,
    RolloutConfig,
    SamplingConfig,
    ScriptedPolicy,
    run_episodes,
)
from arborl.rollout import generate as generate_mod
from arborl.trajectory.schema import Episode, linearize

from .conftest import CountEnv


def _specs(lengths: list[int], seed0: int = 0) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(task_id=f"t{i}", task_type="count", group_id=f"g{i // 2}", seed=seed0 + i, options={"length": n})
        for i, n in enumerate(lengths)
    ]


def _run(policy, specs, *, greedy=True, batch_size=8, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=0, **kw):
    cfg = RolloutConfig(
        max_turns=kw.pop("max_turns", 6),
        max_context_tokens=kw.pop("max_context_tokens", 1000),
        invalid_action_penalty=kw.pop("invalid_action_penalty", 0.0),
        sampling=SamplingConfig(max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature, top_p=top_p),
        batch_size=batch_size,
    )
    return run_episodes(policy, kw.pop("envs", CountEnv), specs, cfg, generator=torch.Generator().manual_seed(seed), **kw)


def _tokens(episodes):
    return [[t.output_ids for t in ep.turns] for ep in episodes]


@pytest.mark.parametrize(("temperature", "top_p", "greedy"), [(0.7, 0.9, False), (1.0, 1.0, True)])
def test_behaviour_logprobs_equal_recomputed_logprobs(model, renderer, temperature, top_p, greedy):
    eps = _run(ModelPolicy(model, renderer), _specs([3, 3, 2, 3]), greedy=greedy, temperature=temperature, top_p=top_p)
    assert [len(e.turns) for e in eps] == [3, 3, 2, 3]
    t = 1.0 if greedy else temperature
    for ep in eps:
        ep.validate()
        view = linearize(ep)
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([view.input_ids]), temperature=t)[0]
        trained = torch.tensor(view.loss_mask, dtype=torch.bool)
        assert trained.sum() > 0
        diff = (lp[trained] - torch.tensor(view.logprobs)[trained]).abs().max().item()
        assert diff < 1e-4


def test_linearized_episode_is_exactly_what_the_model_saw(model, renderer):
    (ep,) = _run(ModelPolicy(model, renderer), _specs([3]))
    ids = linearize(ep).input_ids
    pieces = []
    for k, turn in enumerate(ep.turns):
        expected_prompt = renderer.first_prompt(turn.observation) if k == 0 else renderer.next_prompt(turn.observation)
        assert turn.prompt_ids == expected_prompt
        assert turn.output_ids[-1] in renderer.end_token_ids
        pieces += turn.prompt_ids + turn.output_ids
    assert ids == pieces


def test_kept_cache_generates_the_same_tokens_as_reprefill(model, renderer):
    specs = _specs([4, 1, 3, 2, 4, 3])
    kept = _run(ModelPolicy(model, renderer), specs, batch_size=4)
    fresh = _run(ModelPolicy(model, renderer, reuse_cache=False), specs, batch_size=4)
    assert _tokens(kept) == _tokens(fresh)
    assert sum(len(t) for t in _tokens(kept)) == 17


def test_cache_compaction_does_not_change_tokens(model, renderer, monkeypatch):
    specs = _specs([4, 1, 3, 2, 4, 3])
    monkeypatch.setattr(generate_mod, "COMPACT_WASTE", 1.0)  # never compact
    never = _run(ModelPolicy(model, renderer), specs, batch_size=3)
    monkeypatch.setattr(generate_mod, "COMPACT_WASTE", -1.0)  # compact before every turn
    always = _run(ModelPolicy(model, renderer), specs, batch_size=3)
    assert _tokens(never) == _tokens(always)


def test_batched_equals_unbatched(model, renderer):
    specs = _specs([1, 4, 2, 3, 4, 1, 2, 3], seed0=5)
    one = _run(ModelPolicy(model, renderer), specs, batch_size=1)
    eight = _run(ModelPolicy(model, renderer), specs, batch_size=8)
    assert _tokens(one) == _tokens(eight)
    assert [e.task_id for e in eight] == [s.task_id for s in specs]


def test_sampling_is_reproducible_from_the_generator(model, renderer):
    specs = _specs([3, 2, 3])
    a = _run(ModelPolicy(model, renderer), specs, greedy=False, seed=1)
    b = _run(ModelPolicy(model, renderer), specs, greedy=False, seed=1)
    c = _run(ModelPolicy(model, renderer), specs, greedy=False, seed=2)
    assert _tokens(a) == _tokens(b)
    assert _tokens(a) != _tokens(c)


def test_loss_mask_covers_generated_tokens_only_and_cut_turns_end_with_forced_token(model, renderer):
    eps = _run(ModelPolicy(model, renderer), _specs([3, 3]), greedy=False, max_new_tokens=2)
    end = renderer.end_token_ids[0]
    forced = 0
    for ep in eps:
        view = linearize(ep)
        k = 0
        for turn in ep.turns:
            assert view.loss_mask[k : k + len(turn.prompt_ids)] == [0] * len(turn.prompt_ids)
            k += len(turn.prompt_ids)
            assert view.loss_mask[k : k + len(turn.output_ids)] == turn.output_mask
            k += len(turn.output_ids)
            assert turn.output_ids[-1] in renderer.end_token_ids
            if len(turn.output_ids) == 3:  # two sampled tokens, then the forced end
                assert turn.output_ids[-1] == end and turn.output_mask == [1, 1, 0]
                assert turn.output_logprobs[-1] == 0.0
                forced += 1
            else:
                assert turn.output_mask == [1] * len(turn.output_ids)
        assert k == len(view.input_ids)
    assert forced > 0


def test_turn_fields_rewards_and_chain(model, renderer):
    policy = ScriptedPolicy(lambda env: "go", renderer)
    (ep,) = _run(policy, _specs([3]), iteration=7, source="synth", policy_version=2)
    assert ep.stop_reason == "terminated"
    assert ep.rewards == {"success": 1.0, "return": 3.0}
    assert (ep.task_id, ep.task_type, ep.group_id, ep.seed) == ("t0", "count", "g0", 0)
    assert (ep.iteration, ep.source, ep.policy_version) == (7, "synth", 2)
    assert ep.metadata["env"] == "CountEnv"
    assert [t.parent_id for t in ep.turns] == [None, ep.turns[0].turn_id, ep.turns[1].turn_id]
    assert [t.state_key for t in ep.turns] == ["(3, 0)", "(3, 1)", "(3, 2)"]
    assert [t.observation for t in ep.turns] == ["step 0 of board", "step 1 of board go", "step 2 of board go left"]
    assert [t.result for t in ep.turns] == [t.observation for t in ep.turns[1:]] + ["step 3 of board go left right"]
    assert all(t.action_text == "go" and t.action == "go" and t.valid for t in ep.turns)
    assert all(t.output_ids == renderer.encode_response("go") and t.output_logprobs == [0.0, 0.0] for t in ep.turns)
    assert [t.terminated for t in ep.turns] == [False, False, True]
    assert set(ep.turns[0].timings) == {"generate", "env"}
    assert ep.turns[-1].info == {"action_valid": True, "action": "go", "success": True}
    ep.validate()
    assert Episode.from_json(ep.to_json()).to_dict() == ep.to_dict()


def test_scripted_episode_tokens_equal_full_chat_render(renderer):
    (ep,) = _run(ScriptedPolicy(lambda env: env.expert_action(), renderer), _specs([3]))
    messages = []
    for t in ep.turns:
        messages += [{"role": "user", "content": t.observation}, {"role": "assistant", "content": t.action_text}]
    assert linearize(ep).input_ids == renderer.render_ids(messages, generation_prompt=False)


def test_invalid_action_penalty_is_added(renderer):
    actions = iter(["go", "jump", "go", "jump"])
    policy = ScriptedPolicy(lambda env: next(actions), renderer)
    (ep,) = _run(policy, _specs([4]), batch_size=1, invalid_action_penalty=-0.25)
    assert [t.valid for t in ep.turns] == [True, False, True, False]
    assert [t.reward for t in ep.turns] == [1.0, -0.25, 1.0, -0.25]
    assert ep.rewards["return"] == 2.0  # env rewards only
    assert ep.turns[1].action is None


class FailingEnv(CountEnv):
    """Raises in reset (seed 1), in step at turn 2 (seed 2), in format_observation at turn 1 (seed 3)."""

    def reset(self, *, seed=None, options=None):
        if seed == 1:
            raise RuntimeError("reset exploded")
        self.fail_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        if self.fail_seed == 2 and self.t == 1:
            raise RuntimeError("step exploded")
        return super().step(action)

    def format_observation(self, obs):
        if self.fail_seed == 3 and self.t == 1:
            raise ValueError("format exploded")
        return super().format_observation(obs)


@pytest.mark.parametrize("pool", ["factory", "list"])
def test_failing_env_is_recorded_and_the_batch_goes_on(renderer, pool):
    specs = _specs([3, 3, 3, 3, 3])
    envs = FailingEnv if pool == "factory" else [FailingEnv() for _ in range(2)]
    eps = _run(ScriptedPolicy(lambda env: "go", renderer), specs, envs=envs, batch_size=2)
    assert [e.stop_reason for e in eps] == ["terminated", "env_error", "env_error", "env_error", "terminated"]
    assert eps[1].turns == [] and "reset exploded" in eps[1].metadata["error"]
    assert eps[1].rewards == {"success": None, "return": 0.0}
    assert len(eps[2].turns) == 2 and "step exploded" in eps[2].turns[1].error
    assert len(eps[3].turns) == 1 and "format exploded" in eps[3].turns[0].error
    assert eps[3].turns[0].reward == 1.0  # the step itself happened before formatting failed
    assert eps[0].rewards == eps[4].rewards == {"success": 1.0, "return": 3.0}


def test_failing_script_and_factory_are_recorded(renderer):
    def script(env):
        if env.seed == 0:
            raise KeyError("no expert")
        return "go"

    eps = _run(ScriptedPolicy(script, renderer), _specs([2, 2]))
    assert eps[0].stop_reason == "env_error" and "no expert" in eps[0].turns[0].error
    assert eps[1].stop_reason == "terminated"

    def factory():
        raise OSError("cannot build env")

    eps = _run(ScriptedPolicy(script, renderer), _specs([2]), envs=factory)
    assert eps[0].stop_reason == "env_error" and "cannot build env" in eps[0].metadata["error"]


def test_max_turns_and_max_context_stop_episodes(model, renderer):
    (ep,) = _run(ModelPolicy(model, renderer), _specs([9]), max_turns=2)
    assert ep.stop_reason == "max_turns" and len(ep.turns) == 2 and ep.turns[-1].truncated
    assert ep.rewards["success"] is None
    first = len(renderer.first_prompt("step 0 of board"))
    # Room for the first turn (prompt + 6 new tokens + a forced end) but not for a second one.
    (ep,) = _run(ModelPolicy(model, renderer), _specs([9]), max_context_tokens=first + 7 + 5)
    assert ep.stop_reason == "max_context" and len(ep.turns) == 1 and ep.turns[-1].truncated
    (ep,) = _run(ModelPolicy(model, renderer), _specs([9]), max_context_tokens=first + 3)
    assert ep.stop_reason == "max_context" and ep.turns == []


class _BinaryOutputEnv(CountEnv):
    """Like CountEnv, but what it shows contains NUL characters and lone surrogates, as the output of
    model-written code may."""

    def format_observation(self, obs):
        return f"{obs} \x00 tool said \udcff"

    def step(self, action: str) -> StepResult:
        res = super().step(action)
        return StepResult(res.obs, res.reward, res.terminated, res.truncated, {**res.info, "error": "bad \x00 byte"})


def test_unstorable_characters_in_env_text_are_replaced_so_the_store_keeps_the_episode(model, renderer, tmp_path):
    from arborl.store import open_store

    eps = _run(ModelPolicy(model, renderer), _specs([2, 2]), envs=_BinaryOutputEnv)
    turn = eps[0].turns[0]
    assert turn.observation.endswith("\ufffd tool said \ufffd") and "\x00" not in turn.result
    assert turn.error == "bad \ufffd byte"
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:  # refused the whole batch before
        store.put_many(eps)
        assert store.get(eps[0].episode_id).turns[0].observation == turn.observation


def test_tool_call_arguments_the_store_would_refuse_are_kept_as_text():
    from arborl.rollout.engine import _tool_call
    from arborl.trajectory.values import is_storable

    call = _tool_call({"name": "search", "arguments": {"q": "a\x00b", "n": 2**70}, "call_id": "c\udcff"})
    assert call.name == "search" and call.call_id == "c\ufffd"
    assert list(call.arguments) == ["unstorable_arguments"] and "\x00" not in call.arguments["unstorable_arguments"]
    assert is_storable(call.arguments)
    assert _tool_call({"name": "calc", "arguments": {"expr": "1+2"}}).arguments == {"expr": "1+2"}
