"""EpisodeGuard: the step-order rules live in one wrapper, and the rollout drives envs through it."""

import pytest
import torch

from arborl.env import EpisodeGuard, StepResult, check_env, guard
from arborl.env.envs import FrozenLake
from arborl.env.wrappers import ENDED_ERROR


class TwoSteps:
    """Ends after two valid steps, and keeps counting if stepped again (no done flag of its own)."""

    actions = ("go",)
    max_steps = 2

    def __init__(self):
        self.t, self.calls = 0, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.t, {}

    def step(self, action):
        self.calls += 1
        if action.strip() != "go":
            return StepResult(self.t, 0.0, info={"action_valid": False, "error": "say go"})
        self.t += 1
        done = self.t >= 2
        return StepResult(self.t, 0.5 * self.t, terminated=done, info={"action_valid": True, **({"success": True} if done else {})})

    def format_observation(self, obs):
        return f"t {obs}"

    def state_key(self):
        return (self.t,)

    def expert_action(self):
        return "go"

    def close(self):
        pass


def test_an_env_without_a_done_flag_passes_check_env():
    check_env(TwoSteps(), seed=0, n_steps=10)


def test_steps_after_the_end_are_answered_without_the_env():
    env = TwoSteps()
    g = guard(env)
    g.reset(seed=0)
    g.step("go")
    last = g.step("go")
    assert last.terminated and env.calls == 2
    for action in ("go", "nonsense"):
        res = g.step(action)
        assert (res.obs, res.reward, res.terminated, res.truncated) == (2, 0.0, False, True)
        assert res.info == {"action_valid": False, "action": None, "error": ENDED_ERROR, "success": True}
    assert env.calls == 2 and g.state_key() == (2,)
    g.reset(seed=1)
    assert g.step("go").reward == 0.5 and env.calls == 3  # a new episode steps the env again


def test_step_before_reset_is_refused():
    with pytest.raises(RuntimeError, match=r"TwoSteps: call reset\(\) before step\(\)"):
        guard(TwoSteps()).step("go")


def test_the_env_own_attributes_show_through():
    env = TwoSteps()
    g = guard(env)
    assert g.actions == ("go",) and g.max_steps == 2 and g.expert_action() == "go"
    assert g.unwrapped is env and guard(g) is g and isinstance(g, EpisodeGuard)
    assert not hasattr(g, "task_type")  # absent stays absent: callers fall back to the class name
    g.reset(seed=0)
    assert g.format_observation(0) == "t 0"


def test_a_truncated_end_repeats_the_failure():
    g = guard(FrozenLake(max_steps=1))
    g.reset(seed=0, options={"desc": ["SFG"]})
    assert g.step("Left").truncated
    res = g.step("Right")
    assert res.truncated and res.info["success"] is False and res.info["error"] == ENDED_ERROR


def test_the_rollout_drives_every_env_through_the_guard():
    from arborl.policy import ChatRenderer, train_tokenizer
    from arborl.rollout import EpisodeSpec, RolloutConfig, ScriptedPolicy, run_episodes

    tok = train_tokenizer(["t 0 1 2 go"])
    seen = []

    def act(env):
        seen.append(env)
        return "go"

    envs = [TwoSteps(), TwoSteps()]
    specs = [EpisodeSpec(f"t{i}", "two", "g", seed=i) for i in range(4)]
    eps = run_episodes(ScriptedPolicy(act, ChatRenderer(tok)), envs, specs, RolloutConfig(max_turns=5),
                       generator=torch.Generator().manual_seed(0))
    assert [len(e.turns) for e in eps] == [2, 2, 2, 2] and all(e.stop_reason == "terminated" for e in eps)
    assert {type(e) for e in seen} == {EpisodeGuard} and {id(e.unwrapped) for e in seen} == {id(x) for x in envs}
    assert sum(e.calls for e in envs) == 8  # never stepped after an end
    assert {e.metadata["env"] for e in eps} == {"TwoSteps"}
