"""Deliberately broken environments for the CLI's check_env error paths."""

from arborl.env import StepResult


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


class NoStateKey(NoClose):
    """Everything but ``state_key``."""

    task_type = "broken"

    def close(self):
        pass
