"""The env steps of a batch run concurrently, under a deadline, and the episodes do not depend on thread timing."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
import torch

from arborl.env import StepResult, Task, ToolEnv
from arborl.rollout import (
    EpisodeSpec,
    ModelPolicy,
    RolloutConfig,
    SamplingConfig,
    ScriptedPolicy,
    run_episodes,
)
from arborl.rollout.workers import Overdue, WorkerPool
from tests.rollout.conftest import CountEnv

from .test_tool_env import Sleeper, call, exact

pytest.importorskip("transformers")


class Clock:
    """A tool that records when each call ran (monotonic seconds) and by which thread."""

    name = "clock"
    description = "Say the time."
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, arguments: dict[str, Any]) -> str:
        with self.lock:
            self.stamps.append(time.monotonic())
        return "tick"


def _specs(n: int) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"t{i}", task_type="tool", group_id=f"g{i}", seed=i) for i in range(n)]


def test_one_slow_tool_call_runs_while_the_other_episodes_step(renderer):
    """Episode 0 sleeps 1.5 s in its first step; the 5 others' steps all finish long before it does."""
    clock = Clock()
    tasks = [Task("q", answer="a", id=f"t{i}") for i in range(6)]

    def script(env) -> str:
        if env.unwrapped.steps == 1:
            return "<answer>a</answer>"
        return call("sleep", s=1.5) if env.unwrapped.task.id == "t0" else call("clock")

    cfg = RolloutConfig(max_turns=4, env_workers=8, sampling=SamplingConfig(max_new_tokens=8))
    t0 = time.monotonic()
    eps = run_episodes(ScriptedPolicy(script, renderer),
                       lambda: ToolEnv(tasks, [Sleeper(), clock], exact, call_timeout_s=5), _specs(6), cfg,
                       generator=torch.Generator().manual_seed(0))
    wall = time.monotonic() - t0
    slow_done = t0 + eps[0].turns[0].timings["env"]  # no earlier than t0 + 1.5
    assert eps[0].turns[0].timings["tool"] >= 1.5
    assert len(clock.stamps) == 5 and max(clock.stamps) < slow_done - 1.0  # ordering: they did not wait for it
    assert all(ep.success for ep in eps) and wall < 1.5 + 2.0


def test_steps_of_a_turn_overlap_instead_of_adding_up(renderer):
    """8 episodes each sleep 0.5 s per step, 2 steps: sequential is >= 8 s, concurrent ~1 s."""
    tasks = [Task("q", answer="a", id=f"t{i}") for i in range(8)]

    def script(env) -> str:
        return call("sleep", s=0.5) if env.unwrapped.steps < 2 else "<answer>a</answer>"

    def run(workers: int) -> float:
        cfg = RolloutConfig(max_turns=4, env_workers=workers, sampling=SamplingConfig(max_new_tokens=8))
        t0 = time.monotonic()
        eps = run_episodes(ScriptedPolicy(script, renderer), lambda: ToolEnv(tasks, [Sleeper()], exact), _specs(8),
                           cfg, generator=torch.Generator().manual_seed(0))
        assert all(ep.success for ep in eps)
        assert all(0.5 <= t.timings["tool"] < 1.5 for ep in eps for t in ep.turns[:2])  # the turn records the latency
        return time.monotonic() - t0

    assert run(8) < 2.5  # 2 steps x 0.5 s, plus margin for a loaded machine
    assert run(1) >= 8.0  # the same rollout with one worker: the sum


def test_episodes_are_the_same_whatever_the_number_of_workers(model, renderer):
    """A sampling policy on deterministic envs: 1 worker and 8 workers give identical trajectories."""
    specs = [EpisodeSpec(task_id=f"c{i}", task_type="count", group_id=f"g{i % 3}", seed=i, options={"length": 2 + i % 3})
             for i in range(12)]

    def run(workers: int):
        cfg = RolloutConfig(max_turns=5, batch_size=5, env_workers=workers,
                            sampling=SamplingConfig(temperature=1.0, max_new_tokens=3))
        return run_episodes(ModelPolicy(model, renderer), CountEnv, specs, cfg,
                            generator=torch.Generator().manual_seed(3))

    def content(eps):
        return [(ep.task_id, ep.stop_reason, ep.rewards,
                 [(t.prompt_ids, t.output_ids, t.output_logprobs, t.action_text, t.reward, t.valid, t.result)
                  for t in ep.turns]) for ep in eps]

    one, many = run(1), run(8)
    assert content(one) == content(many)
    assert sum(len(ep.turns) for ep in one) > 24


class Hang:
    """Step 1 of seed 0 hangs for ``hang_s``; everything else is CountEnv."""

    instances: list[Hang] = []

    def __init__(self, hang_s: float = 3.0) -> None:
        self.inner, self.hang_s = CountEnv(3), hang_s
        self.closed = False
        Hang.instances.append(self)

    def reset(self, *, seed=None, options=None):
        self.seed = seed
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        if self.seed == 0 and self.inner.t == 1:
            time.sleep(self.hang_s)
        return self.inner.step(action)

    def format_observation(self, obs):
        return self.inner.format_observation(obs)

    def state_key(self):
        return self.inner.state_key()

    def close(self) -> None:
        self.closed = True


def test_a_step_past_the_deadline_ends_its_episode_and_its_env_is_never_used_again(renderer):
    Hang.instances = []
    cfg = RolloutConfig(max_turns=5, batch_size=2, env_timeout_s=0.4, sampling=SamplingConfig(max_new_tokens=4))
    t0 = time.monotonic()
    eps = run_episodes(ScriptedPolicy(lambda env: "go", renderer), Hang, _specs(4), cfg,
                       generator=torch.Generator().manual_seed(0))
    assert time.monotonic() - t0 < 2.5  # did not wait for the 3 s hang
    hung = eps[0]
    assert hung.stop_reason == "env_error" and len(hung.turns) == 2
    assert hung.turns[-1].error == "env step did not return within 0.4 s (rollout.env_timeout_s)"
    assert hung.turns[-1].result is None and hung.turns[-1].timings["env"] == 0.4
    assert [ep.stop_reason for ep in eps[1:]] == ["terminated"] * 3 and all(ep.success for ep in eps[1:])
    assert len(Hang.instances) == 3 and not Hang.instances[0].closed  # replaced, and left alone while it runs
    for ep in eps:
        ep.validate()


def test_worker_pool_results_in_order_overdue_and_errors():
    pool = WorkerPool(2)
    try:
        out = pool.run_calls([lambda: time.sleep(0.2) or "slow", lambda: "fast", lambda: time.sleep(5)], 1.0)
        assert out == ["slow", "fast", Overdue(1.0)]
        assert pool.run_calls([lambda: 1, lambda: 2, lambda: 3], 1.0) == [1, 2, 3]  # the hung thread was replaced
        with pytest.raises(ZeroDivisionError):
            pool.run_calls([lambda: 1 / 0], 1.0)
    finally:
        pool.close()
    with pytest.raises(ValueError, match="workers is 0"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="env_timeout_s"):
        dataclasses.replace(RolloutConfig(), env_timeout_s=0)
