"""The code env on the real sandbox: the oracle's loop, metrics, invalid calls, timeouts, concurrency."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from arborl.code.data import write_jsonl
from arborl.code.env import FAST_ORDER, choose_backend, code_env, python_call
from arborl.code.problems import generate_problem
from arborl.config import ConfigError
from arborl.env.check import check_env
from arborl.sandbox.core import probe_backend

HELD = 1_000_000_000


def play(env, seed, first=()):
    """Reset to ``seed``, take the ``first`` actions, then the oracle's; return the step results."""
    env.reset(seed=seed)
    out = []
    for action in first:
        out.append(env.step(action))
    while not out or not (out[-1].terminated or out[-1].truncated):
        out.append(env.step(env.expert_action()))
    return out


def seed_of(kind, test=False):
    return next(s for s in range(100) if generate_problem(s, test=test).kind == kind) + (HELD if test else 0)


def test_auto_is_the_first_working_backend_of_the_fast_order():
    assert choose_backend("auto") == next(b for b in FAST_ORDER if probe_backend(b) is None)
    assert choose_backend("bwrap") == "bwrap" and "process" not in FAST_ORDER
    with pytest.raises(ConfigError, match="sandbox = 'nope'"):
        choose_backend("nope")


def test_check_env_passes():
    check_env(code_env())


@pytest.mark.parametrize("test", [False, True])
def test_oracle_synthesis_runs_once_then_submits(test):
    steps = play(code_env(), seed_of("synth", test))
    assert [s.info["action"] for s in steps] == ["python", "answer"]
    assert "visible tests : 2 / 2 passed" in steps[0].obs
    assert steps[-1].reward == 1.0 and steps[-1].info["success"]
    assert steps[-1].info["metrics"] == {"pass_rate": 1.0, "tool_calls": 1.0, "fixed_failing": 0.0,
                                         "sandbox_timeouts": 0.0, "submitted": 1.0, "submitted_untested": 0.0}


def test_oracle_bugfix_sees_the_failure_then_fixes_it():
    seed = seed_of("bugfix")
    steps = play(code_env(), seed)
    pr = generate_problem(seed)
    assert [s.info["action"] for s in steps] == ["python", "python", "answer"]
    assert "test 1 failed" in steps[0].obs and f"visible tests : {len(pr.visible)} / {len(pr.visible)} passed" not in steps[0].obs
    assert f"visible tests : {len(pr.visible)} / {len(pr.visible)} passed" in steps[1].obs
    assert steps[-1].reward == 1.0
    assert steps[-1].info["metrics"]["fixed_failing"] == 1.0 and steps[-1].info["metrics"]["tool_calls"] == 2.0


def test_the_imperfect_teacher_submits_a_stable_share_of_bug_reports_untested():
    from arborl.env.split import stable_unit

    env = code_env(oracle_error=0.6)
    assert env.deterministic is False and code_env().deterministic is True
    seeds = [s for s in range(200) if generate_problem(s).kind == "bugfix"]
    slipped = [s for s in seeds if stable_unit(f"oracle-{generate_problem(s).id}") < 0.6]
    assert 0.4 < len(slipped) / len(seeds) < 0.8
    steps = play(env, slipped[0])  # the slip: the given code, untested, scores 0
    assert [s.info["action"] for s in steps] == ["answer"] and steps[-1].reward == 0.0
    assert steps[-1].info["metrics"]["submitted_untested"] == 1.0
    kept = next(s for s in seeds if s not in slipped)  # the others: run, fail, fix, submit
    assert [s.info["action"] for s in play(env, kept)] == ["python", "python", "answer"]
    assert [s.info["action"] for s in play(env, seed_of("synth"))] == ["python", "answer"]  # synthesis: no slips
    with pytest.raises(ConfigError, match="oracle_error = 1.5"):
        code_env(oracle_error=1.5)


def test_a_random_action_is_a_real_run_of_the_current_function_with_family_code():
    import random

    from arborl.code.problems import FAMILIES

    env = code_env()
    rng = random.Random(0)
    seen_pass = seen_fail = 0
    for seed in range(12):
        env.reset(seed=seed)
        pr = generate_problem(seed)
        fam = next(f for f in FAMILIES if f.name == pr.entry_point)
        action = env.random_action(rng)
        code = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["code"]
        assert code.strip() in {fam.code(b, k) for b in (fam.body, *fam.bugs) for k in fam.params}
        step = env.step(action)
        assert step.info["action"] == "python" and not step.terminated and "visible tests :" in step.obs
        ok = f"visible tests : {len(pr.visible)} / {len(pr.visible)} passed" in step.obs
        seen_pass, seen_fail = seen_pass + ok, seen_fail + (not ok)
    assert seen_fail > seen_pass  # mostly wrong code, run for real


def test_submitting_the_bug_scores_zero_with_the_hand_computed_pass_rate():
    seed = seed_of("bugfix")
    pr = generate_problem(seed)
    scope: dict = {}
    exec(pr.buggy_code, scope)  # the generator's own bug, to count by hand which hidden tests it passes
    expected = sum(eval(t.call, scope) == t.expected for t in pr.hidden) / len(pr.hidden)
    env = code_env()
    env.reset(seed=seed)
    last = env.step(f"<answer> {pr.buggy_code} </answer>")
    assert last.reward == 0.0 and not last.info["success"]
    assert last.info["metrics"]["pass_rate"] == pytest.approx(expected) and expected < 1


@pytest.mark.parametrize("action", [
    "<tool_call> {not json} </tool_call>",
    '<tool_call> {"name": "shell", "arguments": {"code": "print(1)"}} </tool_call>',
    '<tool_call> {"name": "python", "arguments": {"source": "print(1)"}} </tool_call>',
])
def test_malformed_calls_are_invalid_actions_and_run_nothing(action):
    env = code_env()
    env.reset(seed=0)
    res = env.step(action)
    assert res.info["action_valid"] is False and res.reward == 0.0 and not res.terminated
    assert env.calls == [] and res.obs.startswith("Invalid action")
    assert play(env, 0, first=[action])[-1].reward == 1.0  # the episode goes on to the oracle's answer


def test_a_sandbox_timeout_is_recorded_on_the_turn_and_the_episode_goes_on():
    env = code_env(wall_s=1.0)
    seed = seed_of("synth")
    steps = play(env, seed, first=[python_call("while True : pass")])
    result = steps[0].info["tool_results"][0]
    assert "TimeoutError: killed after 1 s" in result["result"] and steps[0].info["action_valid"]
    assert steps[-1].reward == 1.0
    assert steps[-1].info["metrics"]["sandbox_timeouts"] == 1.0
    assert steps[-1].info["metrics"]["fixed_failing"] == 1.0  # the failed run, then the oracle's passing one


def test_the_judge_ignores_a_faked_status_line():
    env = code_env()
    env.reset(seed=seed_of("synth"))
    fake = "import os\nprint('visible tests : 2 / 2 passed')\nos._exit(0)"
    res = env.step(f"<answer>\n```python\n{fake}\n```\n</answer>")
    assert res.reward == 0.0 and res.info["metrics"]["pass_rate"] == 0.0


def test_envs_step_concurrently():
    seeds = [seed_of("synth"), seed_of("bugfix"), seed_of("synth", True), seed_of("bugfix", True)] * 2

    def one(seed):
        return play(code_env(), seed)[-1].reward

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, seeds)) == [1.0] * len(seeds)


def test_problems_from_the_users_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [generate_problem(3)])
    line = {"id": "mine", "prompt": "Print the sum.", "tests": [{"input": "1 2\n", "output": "3\n"}],
            "solution": "a, b = map(int, input().split())\nprint(a + b)"}
    (tmp_path / "test.jsonl").write_text(json.dumps(line) + "\n")
    env = code_env(train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"))
    env.reset(seed=5)
    assert env.task.id == "code-train-3"
    steps = play(env, HELD + 2)
    assert env.task.id == "mine" and "visible tests : 1 / 1 passed" in steps[0].obs and steps[-1].reward == 1.0


def test_code_framing_is_normalised():
    from arborl.code.env import normalize_code, strip_fences

    assert normalize_code(" def f ( x ) : return x ") == "def f ( x ) : return x "
    assert normalize_code("    def f(x):\n        return x\n") == "def f(x):\n    return x"
    assert normalize_code(" a = 1\nprint(a)") == "a = 1\nprint(a)"
    assert strip_fences("```python\ndef f(x):\n    return x\n```") == "def f(x):\n    return x"
