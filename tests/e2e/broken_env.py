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


class Flaky:
    """FrozenLake that fails by seed from seed 1000 on (below it, what ``check_env``, the tokenizer
    corpus and ``synth`` play, it behaves): ``seed % 3 == 2`` raises in its first step (an env
    error); ``seed % 3 == 1`` shows an observation that grows by ``grow`` words a step, so the
    episode overflows a small ``rollout.max_context_tokens``."""

    def __init__(self, grow: int = 100, **kwargs):
        from arborl.env.envs import FrozenLake

        self.inner, self.grow = FrozenLake(**kwargs), grow
        self.actions = self.inner.actions
        self.task_type = "flaky"

    def reset(self, *, seed=None, options=None):
        self.seed, self.t = seed or 0, 0
        return self.inner.reset(seed=seed, options=options)

    def step(self, action):
        if self.seed >= 1000 and self.seed % 3 == 2:
            raise ConnectionError(f"backend of seed {self.seed} is down")
        self.t += 1
        return self.inner.step(action)

    def format_observation(self, obs):
        text = self.inner.format_observation(obs)
        return text + " Left" * (self.grow * self.t) if self.seed >= 1000 and self.seed % 3 == 1 else text

    def state_key(self):
        return self.inner.state_key()

    def expert_action(self):
        return self.inner.expert_action()

    def close(self):
        self.inner.close()
