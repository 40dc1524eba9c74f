"""check_env: passes a correct env, and names the broken method for each kind of breakage."""

import math
import random

import pytest

from arborl.env import EnvCheckError, StepResult, check_env
from arborl.env.parsing import extract_action


class Corridor:
    """A correct minimal env: walk right from 0 to 3 in at most 6 steps (no done flag: arborl's
    EpisodeGuard answers steps after the end)."""

    task_type = "corridor"
    actions = ("left", "right")
    max_steps = 6

    def __init__(self):
        self.pos, self.steps, self.start = 0, 0, 0

    def reset(self, *, seed=None, options=None):
        self.start = random.Random(seed).randrange(3)
        self.pos, self.steps = self.start, 0
        return self.pos, {}

    def step(self, action):
        self.steps += 1
        name = extract_action(action, self.actions)
        info = {"action_valid": name is not None}
        if name is None:
            info["error"] = "say left or right"
        else:
            self.pos = max(0, self.pos + (1 if name == "right" else -1))
        terminated, truncated = self.pos == 3, self.steps >= self.max_steps and self.pos != 3
        if terminated or truncated:
            info["success"] = terminated
        return StepResult(self.pos, 1.0 if terminated else 0.0, terminated, truncated, info)

    def format_observation(self, obs):
        return f"at {obs}"

    def state_key(self):
        return (self.pos,)

    def expert_action(self):
        return "right"

    def close(self):
        pass


def test_correct_env_passes():
    for seed in range(5):
        check_env(Corridor(), seed=seed, n_steps=30)


class NoStateKey(Corridor):
    state_key = None


class PositionalReset(Corridor):
    def reset(self, seed=None, options=None):
        return super().reset(seed=seed, options=options)


class ResetReturnsObsOnly(Corridor):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0]


class NotSeeded(Corridor):
    counter = 0

    def reset(self, *, seed=None, options=None):
        NotSeeded.counter += 1
        self.pos, self.steps = NotSeeded.counter % 3, 0
        return self.pos, {}


class UnhashableKey(Corridor):
    def state_key(self):
        return [self.pos]


class IdentityKey(Corridor):
    def state_key(self):
        return object()


class RaisesOnGarbage(Corridor):
    def step(self, action):
        if action not in self.actions:
            raise ValueError(f"unknown action {action}")
        return super().step(action)


class GarbageIsValid(Corridor):
    def step(self, action):
        res = super().step(action)
        res.info["action_valid"] = True
        return res


class GarbageMoves(Corridor):
    def step(self, action):
        if extract_action(action, self.actions) is None:
            self.pos += 1
        return super().step(action)


class GarbagePositiveReward(Corridor):
    def step(self, action):
        res = super().step(action)
        return StepResult(res.obs, 0.5 if not res.info["action_valid"] else res.reward, res.terminated, res.truncated, res.info)


class NoErrorText(Corridor):
    def step(self, action):
        res = super().step(action)
        res.info.pop("error", None)
        return res


class IntReward(Corridor):
    def step(self, action):
        res = super().step(action)
        res.reward = int(res.reward)
        return res


class NanReward(Corridor):
    def step(self, action):
        res = super().step(action)
        res.reward = math.nan
        return res


class IntTerminated(Corridor):
    def step(self, action):
        res = super().step(action)
        res.terminated = int(res.terminated)
        return res


class MissingSuccess(Corridor):
    def step(self, action):
        res = super().step(action)
        res.info.pop("success", None)
        return res


class TupleStep(Corridor):
    def step(self, action):
        res = super().step(action)
        return res.obs, res.reward, res.terminated, res.truncated, res.info


class RaisesAfterEnd(Corridor):
    """Raises on a step after the end: allowed, since the guard never lets one through."""

    def step(self, action):
        if self.pos == 3:
            raise RuntimeError("episode over")
        return super().step(action)


class WrongExpert(Corridor):
    def expert_action(self):
        return "left"


class StochasticWrongExpert(WrongExpert):
    deterministic = False


class FormatReturnsDict(Corridor):
    def format_observation(self, obs):
        return {"text": f"at {obs}"}


class CloseRaises(Corridor):
    def close(self):
        raise OSError("already closed")


@pytest.mark.parametrize(
    ("env_cls", "fragments"),
    [
        (NoStateKey, ["state_key: expected a method `state_key`", "add `def state_key(self)"]),
        (PositionalReset, ["reset: expected keyword-only parameters `seed` and `options`", "bare"]),
        (ResetReturnsObsOnly, ["reset(seed=0): expected a tuple (obs, info)", "return `obs, {}`"]),
        (NotSeeded, ["reset(seed=0): expected the same observation for the same seed", "random.Random(seed)"]),
        (UnhashableKey, ["state_key (after reset): expected a hashable value", "convert lists to tuples"]),
        (IdentityKey, ["state_key: expected equal keys", "not object identity"]),
        (RaisesOnGarbage, ["step('%%% not an action'): expected no exception; got ValueError", "never raise"]),
        (GarbageIsValid, ["info['action_valid'] is False for text that is not an action"]),
        (GarbageMoves, ["state_key unchanged by an invalid action"]),
        (GarbagePositiveReward, ["reward 0.0 for an invalid action", "got 0.5"]),
        (NoErrorText, ["non-empty str info['error']"]),
        (IntReward, ["expected a finite float reward; got int 0", "float(reward)"]),
        (NanReward, ["finite float reward; got float nan"]),
        (IntTerminated, ["expected a bool `terminated`; got int 0"]),
        (MissingSuccess, ["info['success'] to be a bool when the episode ends"]),
        (TupleStep, ["expected an arborl.env.StepResult; got tuple"]),
        (WrongExpert, ["expert_action: expected following it from reset(seed=0) to end with info['success'] True",
                       "deterministic = False"]),
        (FormatReturnsDict, ["format_observation (after reset): expected a str or a list", "got dict"]),
        (CloseRaises, ["close: expected no exception; got OSError: already closed"]),
    ],
)
def test_each_breakage_gets_a_clear_message(env_cls, fragments):
    with pytest.raises(EnvCheckError) as err:
        check_env(env_cls(), seed=0, n_steps=30)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "Fix:" in message


def test_an_env_need_not_answer_steps_after_its_end():
    for seed in range(5):
        check_env(RaisesAfterEnd(), seed=seed, n_steps=30)


def test_expert_is_not_required_to_succeed_on_a_stochastic_env():
    check_env(StochasticWrongExpert(), seed=0, n_steps=30)


def test_chat_message_observations_are_accepted():
    class Chat(Corridor):
        def format_observation(self, obs):
            return [{"role": "user", "content": f"at {obs}"}]

    check_env(Chat())


def test_builtin_envs_satisfy_the_env_protocol():
    from arborl.env import Env
    from arborl.env.envs import FrozenLake, Sokoban

    assert isinstance(FrozenLake(), Env) and isinstance(Sokoban(), Env)
    assert FrozenLake.task_type == "frozenlake" and Sokoban.task_type == "sokoban"
