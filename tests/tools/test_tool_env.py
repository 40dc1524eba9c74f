"""ToolEnv: the env contract, invalid calls, deadlines, errors, counts and the per-episode tool lifecycle."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from arborl.env import EnvCheckError, StepResult, Task, ToolEnv, check_env
from arborl.tools import CALCULATOR, ErrorResult, SearchR1Format, tool

TASKS = [Task("What is 17 * 23?", answer="391", id="mul"), Task("What is 2 ** 10?", answer="1024", id="pow")]


def exact(answer: str, task: Task) -> float:
    return float(answer.strip() == task.answer)


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


class Notebook:
    """A stateful tool: each episode gets its own page; create/release are counted."""

    name = "notebook"
    description = "Append a line to this episode's page and return the page."
    parameters = {"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]}

    def __init__(self, fail_release: bool = False) -> None:
        self.created: list[list[str]] = []
        self.released: list[list[str]] = []
        self.fail_release = fail_release

    def create(self):
        page: list[str] = []
        self.created.append(page)

        def write(arguments: dict[str, Any]) -> str:
            page.append(arguments["line"])
            return " | ".join(page)

        write.page = page  # type: ignore[attr-defined]
        return write

    def release(self, instance) -> None:
        self.released.append(instance.page)
        if self.fail_release:
            raise OSError("disk gone")


class Sleeper:
    name = "sleep"
    description = "Sleep."
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]}

    def __call__(self, arguments: dict[str, Any]) -> str:
        time.sleep(arguments["s"])
        return "awake"


class Broken:
    name = "broken"
    description = "Raise (a tool that breaks the never-raise contract)."
    parameters = {"type": "object", "properties": {}}

    def __call__(self, arguments: dict[str, Any]) -> str:
        raise RuntimeError("backend down")


def _env(**kw: Any) -> ToolEnv:
    tools = kw.pop("tools", [CALCULATOR, Notebook(), Sleeper(), Broken()])
    return ToolEnv(TASKS, tools, exact, **kw)


@tool
def search(query: str) -> str:
    """Look up a fact.

    Args:
        query: What to look for.
    """
    return {"capital of france": "Paris is the capital of France."}.get(query.lower(), "no results")


def test_check_env_passes_for_both_formats():
    check_env(_env())
    check_env(ToolEnv(TASKS, [search], exact, call_format=SearchR1Format(), instructions="user"))


def oracle(env: ToolEnv) -> str:
    """Compute the task's expression, then answer with the last result."""
    if env.steps == 0:
        return call("calculator", expression=env.task.question.removeprefix("What is ").rstrip("?"))
    return f"<answer>{env.last_results[0]}</answer>"


def test_check_env_follows_an_expert_to_success_and_catches_a_wrong_one():
    check_env(_env(expert=oracle))
    with pytest.raises(EnvCheckError, match="expert_action: expected following it"):
        check_env(_env(expert=lambda env: "<answer>0</answer>"))
    assert not hasattr(_env(), "expert_action")


def test_search_r1_format_needs_a_tool_named_search():
    with pytest.raises(ValueError, match="calls a tool named 'search'; add one to the tool table"):
        ToolEnv(TASKS, [CALCULATOR], exact, call_format=SearchR1Format())
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        ToolEnv(TASKS, [CALCULATOR, CALCULATOR], exact)


def test_an_episode_call_then_answer():
    env = _env()
    obs, _ = env.reset(seed=0)
    assert obs[0]["role"] == "system" and '"name": "calculator"' in obs[0]["content"]
    assert obs[1] == {"role": "user", "content": "What is 17 * 23?"}
    k0 = env.state_key()
    res = env.step("I will compute. " + call("calculator", expression="17 * 23"))
    assert (res.reward, res.terminated, res.truncated) == (0.0, False, False)
    assert env.format_observation(res.obs) == "<tool_response>\n391\n</tool_response>"
    info = res.info
    assert info["action_valid"] is True and info["action"] == "calculator"
    assert info["tool_call"] == {"name": "calculator", "arguments": {"expression": "17 * 23"}, "call_id": "call_1_0"}
    (r,) = info["tool_results"]
    assert (r["name"], r["result"], r["error"], r["timed_out"]) == ("calculator", "391", False, False)
    assert info["tool_stats"] == {"calculator": {"calls": 1, "errors": 0, "timeouts": 0}}
    assert env.state_key() != k0
    end = env.step("<answer>391</answer>")
    assert (end.reward, end.terminated, end.info["success"]) == (1.0, True, True)
    env.reset(seed=0)
    assert env.step("<answer>390</answer>").info["success"] is False


@pytest.mark.parametrize(("text", "error"), [
    (call("rm", path="/"), "unknown tool 'rm'; the tools are broken, calculator, notebook, sleep"),
    (call("calculator", expression=17), "argument 'expression' must be string, got integer 17"),
    (call("calculator"), "the call to calculator is missing required argument 'expression'"),
    (call("calculator", expression="1") + call("rm"), "unknown tool 'rm'"),  # one bad call: nothing runs
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"</tool_call>', "is not valid JSON"),
    ("<tool_call>" + call("calculator", expression="1"), "tags cannot be nested"),
    ("just text", "no <tool_call> call and no <answer>"),
])
def test_malformed_calls_are_invalid_actions_that_say_what_and_run_nothing(text, error):
    env = _env()
    env.reset(seed=0)
    before = env.state_key()
    res = env.step(text)
    assert res.info["action_valid"] is False and res.reward == 0.0
    assert error in res.info["error"] and error in env.format_observation(res.obs)
    assert env.format_observation(res.obs).startswith("Invalid action: ")
    assert env.state_key() == before
    assert env.tool_counts == {} and "tool_stats" not in res.info


def test_a_parsed_but_invalid_call_is_still_recorded_as_the_turns_tool_call():
    env = _env()
    env.reset(seed=0)
    res = env.step(call("calculator", expression=17))
    assert res.info["tool_call"] == {"name": "calculator", "arguments": {"expression": 17}, "call_id": "call_1_0"}


def test_timeouts_and_exceptions_are_results_counted_per_tool_and_the_episode_goes_on():
    env = _env(call_timeout_s=0.2)
    env.reset(seed=0)
    t0 = time.perf_counter()
    res = env.step(call("sleep", s=3))
    assert time.perf_counter() - t0 < 1.5
    assert env.format_observation(res.obs) == "<tool_response>\nTimeoutError: sleep did not answer within 0.2 s\n</tool_response>"
    assert res.info["tool_results"][0]["timed_out"] is True and res.info["action_valid"] is True
    assert res.info["error"].startswith("sleep: TimeoutError")
    res = env.step(call("broken"))
    assert "RuntimeError: backend down" in env.format_observation(res.obs)
    res = env.step(call("calculator", expression="1/0") + call("calculator", expression="2+2"))
    assert env.format_observation(res.obs) == ("<tool_response>\nCalculatorError: division by zero\n</tool_response>\n"
                                               "<tool_response>\n4\n</tool_response>")
    assert res.info["tool_stats"] == {"calculator": {"calls": 2, "errors": 1, "timeouts": 0}}
    assert env.tool_counts == {"sleep": {"calls": 1, "errors": 1, "timeouts": 1},
                               "broken": {"calls": 1, "errors": 1, "timeouts": 0},
                               "calculator": {"calls": 2, "errors": 1, "timeouts": 0}}
    assert env.step("<answer>391</answer>").info["success"] is True


def test_long_results_are_cut_with_a_marker():
    @tool
    def big(n: int) -> str:
        return "x" * n

    env = ToolEnv(TASKS, [big], exact, max_result_chars=10)
    env.reset(seed=0)
    res = env.step(call("big", n=25))
    assert res.info["tool_results"][0]["result"] == "x" * 10 + "\n...[truncated 15 bytes]"


def _lifecycle_env(nb: Notebook, **kw: Any) -> ToolEnv:
    return ToolEnv(TASKS, [nb, CALCULATOR], kw.pop("reward", exact), **kw)


def test_stateful_tools_get_one_instance_per_episode_released_when_it_ends():
    nb = Notebook()
    env = _lifecycle_env(nb)
    env.reset(seed=0)
    env.step(call("calculator", expression="1"))
    assert nb.created == []  # created on the first call, not before
    assert env.format_observation(env.step(call("notebook", line="a")).obs) == "<tool_response>\na\n</tool_response>"
    assert env.format_observation(env.step(call("notebook", line="b")).obs) == "<tool_response>\na | b\n</tool_response>"
    assert len(nb.created) == 1 and nb.released == []
    env.step("<answer>391</answer>")  # the final step releases
    assert nb.released == [["a", "b"]]
    env.reset(seed=1)
    assert env.format_observation(env.step(call("notebook", line="c")).obs) == "<tool_response>\nc\n</tool_response>"
    assert env.lifecycle == {"created": 2, "released": 1, "release_errors": 0}


def test_release_happens_on_truncation_reset_close_and_when_the_step_raises():
    nb = Notebook()
    env = _lifecycle_env(nb, max_steps=2)
    env.reset(seed=0)
    env.step(call("notebook", line="a"))
    res = env.step(call("notebook", line="b"))  # the step limit: truncated
    assert res.truncated and res.info["success"] is False and len(nb.released) == 1
    env.reset(seed=0)
    env.step(call("notebook", line="c"))
    env.reset(seed=1)  # the rollout cut that episode (token budget): reset releases it
    assert len(nb.released) == 2
    env.step(call("notebook", line="d"))
    env.close()
    env.close()  # idempotent
    assert len(nb.released) == 3

    def broken_reward(answer: str, task: Task) -> float:
        raise KeyError("gold")

    env = _lifecycle_env(nb, reward=broken_reward)
    env.reset(seed=0)
    env.step(call("notebook", line="e"))
    with pytest.raises(KeyError):
        env.step("<answer>x</answer>")
    assert len(nb.released) == 4 and len(nb.created) == 4
    assert env.lifecycle == {"created": 1, "released": 1, "release_errors": 0}


def test_a_failing_release_is_counted_and_a_hung_instance_is_replaced():
    nb = Notebook(fail_release=True)
    env = _lifecycle_env(nb)
    env.reset(seed=0)
    env.step(call("notebook", line="a"))
    env.step("<answer>391</answer>")
    assert env.lifecycle == {"created": 1, "released": 1, "release_errors": 1}

    gate = threading.Event()

    class Hangs(Notebook):
        def create(self):
            inst = super().create()

            def hang(arguments: dict[str, Any]) -> str:
                if arguments["line"] == "hang":
                    gate.wait(5)
                return inst(arguments)

            hang.page = inst.page  # type: ignore[attr-defined]
            return hang

    hangs = Hangs()
    env = _lifecycle_env(hangs, call_timeout_s=0.2)
    env.reset(seed=0)
    assert "TimeoutError" in env.format_observation(env.step(call("notebook", line="hang")).obs)
    assert env.format_observation(env.step(call("notebook", line="x")).obs) == "<tool_response>\nx\n</tool_response>"
    env.step("<answer>391</answer>")
    gate.set()
    assert len(hangs.created) == 2 and len(hangs.released) == 2  # the hung one is released too


def test_error_result_from_a_tool_counts_as_an_error():
    class Refuses:
        name, description = "refuse", "Always refuses."
        parameters = {"type": "object", "properties": {}}

        def __call__(self, arguments: dict[str, Any]) -> str:
            return ErrorResult("PermissionError: no")

    env = ToolEnv(TASKS, [Refuses()], exact)
    env.reset(seed=0)
    res = env.step(call("refuse"))
    assert res.info["tool_stats"] == {"refuse": {"calls": 1, "errors": 1, "timeouts": 0}}
    assert isinstance(res, StepResult) and res.info["error"] == "refuse: PermissionError: no"
