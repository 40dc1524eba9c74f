"""The tokenizer corpus of a from-scratch policy holds the env's action words."""

from arborl.env import StepResult
from arborl.env.envs import FrozenLake
from arborl.train.stages import _corpus


class _NoExpert:
    """Two moves on a line; no expert_action, so play is random over the declared actions."""

    actions = ("Push", "Pull", "Wait")

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return 0, {}

    def step(self, action):
        self.t += 1
        done = self.t >= 3
        return StepResult(self.t, 0.0, done, False, {"action_valid": action in self.actions, "success": False})

    def format_observation(self, obs):
        return f"t {obs}"

    def state_key(self):
        return self.t

    def close(self):
        pass


def test_env_without_expert_gets_its_declared_actions_not_a_placeholder():
    texts, actions = _corpus(_NoExpert, episodes=5, seed_start=0, seed=0)
    assert set(actions) == {"Push", "Pull", "Wait"}  # was ["noop"]: the tokenizer lacked every action
    assert "noop" not in actions and texts[0] == "t 0"


def test_env_with_an_expert_keeps_the_order_play_found_the_words_in():
    _, actions = _corpus(lambda: FrozenLake(size=4), episodes=20, seed_start=0, seed=0)
    assert sorted(actions) == sorted(FrozenLake.actions)
