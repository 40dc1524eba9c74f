"""HTTPPolicy against real arborl serve servers: the log-prob invariant, the in-process format, stickiness, failures."""

from __future__ import annotations

import pytest
import torch

from arborl.env.base import StepResult
from arborl.policy import ChatRenderer, load_policy, token_logprobs
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.http_policy import HTTPPolicy
from arborl.serve import PolicyServer, ServedModel
from arborl.trajectory.schema import linearize


class WalkEnv:
    """Lasts ``length`` turns whatever the action; ``on_step(seed, t)`` runs before each step returns."""

    task_type = "walk"
    on_step = None

    def reset(self, *, seed=None, options=None):
        self.seed, self.t, self.length = seed or 0, 0, int((options or {}).get("length", 3))
        return self._obs(), {}

    def _obs(self):
        return " ".join(["go", "left", "right", "up", "down"][: 1 + (self.seed + self.t) % 5])

    def step(self, action):
        self.t += 1
        if WalkEnv.on_step is not None:
            WalkEnv.on_step(self.seed, self.t)
        done = self.t >= self.length
        return StepResult(obs=self._obs(), reward=1.0, terminated=done, info={"success": True} if done else {})

    def format_observation(self, obs):
        return obs

    def state_key(self):
        return (self.seed, self.t)

    def close(self):
        pass


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    WalkEnv.on_step = None


SPECS = [EpisodeSpec(task_id=f"t{i}", task_type="walk", group_id=f"g{i // 2}", seed=i, options={"length": 3})
         for i in range(4)]


def _cfg(**sampling):
    return RolloutConfig(max_turns=4, max_context_tokens=256, batch_size=4, env_workers=1,
                         sampling=SamplingConfig(max_new_tokens=6, **sampling))


def _run(policy, cfg, seed=0, specs=SPECS):
    return run_episodes(policy, WalkEnv, specs, cfg, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def renderer(tokenizer):
    return ChatRenderer(tokenizer, "you are an agent")


def test_rollout_logprobs_through_arborl_serve_equal_the_trainers_recomputed_ones(server, checkpoint, renderer):
    policy = HTTPPolicy([server.url], renderer)
    assert policy.max_context_tokens == 256  # read from GET /v1/models
    eps = _run(policy, _cfg(temperature=0.7))
    model, _ = load_policy(checkpoint)
    assert [e.stop_reason for e in eps] == ["terminated"] * 4
    for ep in eps:
        ep.validate()
        view = linearize(ep)
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([view.input_ids]), temperature=0.7)[0]
        trained = torch.tensor(view.loss_mask, dtype=torch.bool)
        assert trained.sum() > 0
        assert (lp[trained] - torch.tensor(view.logprobs)[trained]).abs().max().item() < 1e-4


def _comparable(ep):
    d = ep.to_dict()
    d.pop("episode_id"), d.pop("created_at")
    for t in d["turns"]:
        t.pop("turn_id"), t.pop("parent_id"), t.pop("timings")
        t["output_logprobs"] = [round(x, 4) for x in t["output_logprobs"]]
    return d


def test_greedy_http_episodes_equal_in_process_ones_field_for_field(server, checkpoint, renderer):
    model, _ = load_policy(checkpoint)
    local = _run(ModelPolicy(model, renderer), _cfg(greedy=True))
    remote = _run(HTTPPolicy([server.url], renderer), _cfg(greedy=True))
    assert [_comparable(e) for e in remote] == [_comparable(e) for e in local]
    assert any(0 in t.output_mask for e in local for t in e.turns)  # a turn cut at the budget is in the comparison


@pytest.fixture
def two_servers(checkpoint):
    a, b = ServedModel(checkpoint, device="cpu", policy_version=10), ServedModel(checkpoint, device="cpu",
                                                                                policy_version=20)
    with PolicyServer(a) as sa, PolicyServer(b) as sb:
        yield sa, sb


def test_episodes_stick_to_one_server_and_spread_over_both(two_servers, renderer):
    sa, sb = two_servers
    eps = _run(HTTPPolicy([sa.url, sb.url], renderer), _cfg())
    versions = [{t.policy_version for t in ep.turns} for ep in eps]
    assert all(len(v) == 1 for v in versions)  # every turn of an episode came from one server
    assert sorted(v.pop() for v in versions) == [10, 10, 20, 20]  # 4 episodes, 2 servers: 2 each


def test_a_server_that_dies_mid_rollout_hands_its_episodes_to_the_other(two_servers, renderer):
    sa, sb = two_servers
    WalkEnv.on_step = lambda seed, t: sa.stop() if (seed, t) == (0, 1) else None
    policy = HTTPPolicy([sa.url, sb.url], renderer, retries=2)
    eps = _run(policy, _cfg())
    assert [e.stop_reason for e in eps] == ["terminated"] * 4
    assert policy.failures >= 1
    moved = [[t.policy_version for t in ep.turns] for ep in eps if ep.turns[0].policy_version == 10]
    assert moved and all(v == [10, 20, 20] for v in moved)  # turn 0 on the dead server, the rest on the live one


def test_when_every_server_is_gone_the_episodes_fail_and_the_rollout_returns(checkpoint, renderer):
    server = PolicyServer(ServedModel(checkpoint, device="cpu")).start()
    WalkEnv.on_step = lambda seed, t: server.stop() if (seed, t) == (0, 1) else None
    policy = HTTPPolicy([server.url], renderer, retries=1, timeout_s=5)
    eps = _run(policy, _cfg())
    assert [e.stop_reason for e in eps] == ["env_error"] * 4
    for ep in eps:
        assert len(ep.turns) == 2 and ep.turns[-1].error.startswith("generation failed: ")
        assert "ConnectError" in ep.turns[-1].error
    assert policy.failures == 4 * 2  # each episode: the first try and one retry


def test_weight_sync_reaches_every_server_and_is_recorded_on_turns(two_servers, checkpoint_b, renderer):
    sa, sb = two_servers
    policy = HTTPPolicy([sa.url, sb.url], renderer)
    policy.sync(str(checkpoint_b), 3)
    assert sa.served.policy_version == sb.served.policy_version == 3
    assert sa.served.path == str(checkpoint_b)
    eps = _run(policy, _cfg())
    assert {t.policy_version for ep in eps for t in ep.turns} == {3}
