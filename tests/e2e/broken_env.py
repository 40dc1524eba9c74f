"""A deliberately broken environment for the CLI's check_env error path."""

from arborl.env import StepResult


class NoStateKey:
    task_type = "broken"

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return StepResult("x", 0.0, True, False, {"action_valid": True})

    def format_observation(self, obs):
        return str(obs)

    def close(self):
        pass


class NoClose:
    """Has the three core methods but neither ``state_key`` nor ``close``."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return StepResult("x", 0.0, True, False, {"action_valid": True})

    def format_observation(self, obs):
        return str(obs)
