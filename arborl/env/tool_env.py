"""A tool-calling environment composed from a task source, a tool table and a reward function.

A new tool task is three objects, not a subclass::

    env = ToolEnv(tasks=[Task("What is 17 * 23?", answer="391")],
                  tools=[CALCULATOR],
                  reward=lambda answer, task: float(answer.strip() == task.answer),
                  call_format=HermesFormat())

Each turn the model either calls tools (in the chosen :mod:`~arborl.tools.formats` syntax) or
gives the final ``<answer>``, which ends the episode with ``reward(answer, task)`` as the step
reward and ``info["success"] = reward >= success_at``. A turn of tool calls is rewarded 0;
its observation is the rendered results, which the rollout feeds as prompt tokens (loss mask 0).

What the env guarantees, for the rollout and the trainer:

* **Malformed calls are invalid actions** (``info["action_valid"] = False``, reward 0, the
  state unchanged, an ``info["error"]`` the observation repeats): a parse error of the format,
  an unknown tool, arguments that break the tool's JSON schema. Nothing runs in such a turn.
* **Every call has a deadline** (``call_timeout_s``): the tool runs in a daemon thread; a call
  that does not answer in time gets a ``TimeoutError`` result and is counted, and a stateful
  instance that hung is not used again. A tool that raises, or returns
  :class:`~arborl.tools.base.ErrorResult`, gives an error result; neither stops the episode.
* **Per-episode lifecycle**: a :class:`~arborl.tools.base.StatefulTool` gets ``create()`` on its
  first call of an episode and ``release(instance)`` exactly once when the episode ends: in a
  ``finally`` of the final step (also when that step raised), else at the next ``reset`` (an
  episode the rollout cut at its token or turn budget) or at ``close``.
* **Records**: ``info["tool_call"]`` (the first call, ``{"name", "arguments", "call_id"}``; the
  rollout turns it into ``Turn.tool_call``), ``info["tool_calls"]`` (all), ``info["tool_results"]``
  (text, ``error``, ``timed_out``, ``latency_s`` per call) and ``info["tool_stats"]`` (this
  step's ``calls``/``errors``/``timeouts`` per tool, for the trainer to sum); the env keeps
  running totals in :attr:`ToolEnv.tool_counts` and instance counts in :attr:`ToolEnv.lifecycle`.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from arborl.env.base import StepResult
from arborl.tools.base import ErrorResult, StatefulTool, Tool, truncate
from arborl.tools.formats import CallFormat, HermesFormat, ParsedCall
from arborl.tools.schema import check_arguments


@dataclass(frozen=True)
class Task:
    """One question and whatever its reward function needs.

    Attributes:
        question: The user message that starts the episode.
        answer: The reference the reward compares with (any type the reward understands).
        id: Task id (default: the question); part of ``state_key``.
        metadata: Extras for the reward function.
    """

    question: str
    answer: Any = None
    id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


RewardFn = Callable[[str, Task], float]
"""``reward(answer_text, task) -> float``: the score of a final answer."""


@dataclass
class _Outcome:
    text: str
    error: bool = False
    timed_out: bool = False
    latency_s: float = 0.0


class ToolEnv:
    """Question answering with tools, as the env contract of :mod:`arborl.env.base`.

    Args:
        tasks: A sequence of :class:`Task` (``reset(seed=s)`` plays ``tasks[s % len(tasks)]``) or a
            function ``seed -> Task``.
        tools: The tool table: :class:`~arborl.tools.base.Tool` s and
            :class:`~arborl.tools.base.StatefulTool` s with distinct names.
        reward: Scores the final answer (see :data:`RewardFn`); must return a finite number.
        call_format: How calls are written and results shown (default :class:`HermesFormat`).
        max_steps: Turns per episode (invalid ones count); the last one truncates.
        call_timeout_s: Deadline of every tool call, in seconds.
        max_result_chars: A result longer than this is cut with a visible marker.
        success_at: ``info["success"]`` is ``reward >= success_at``.
        instructions: ``"system"``: the format's instructions are the system message;
            ``"user"``: they open the first user message (for templates without a system role).
        system_prompt: Text put before the instructions.
        format_instructions: Replaces the call format's own instructions (e.g. a one-line
            version for a small model; ``None`` keeps the format's).
        task_type: The store's capability bucket.
        expert: ``expert(env) -> action text`` (e.g. an oracle that knows the task's gold
            queries); when given, the env has ``expert_action()`` for ``check_env`` and ``synth``.
        deterministic: ``False`` when the tools' results are random (``check_env`` then does
            not replay the expert).
        metrics: ``metrics(env, answer) -> {name: value}``, called when an episode ends (on its
            answer, or with ``None`` when it ran out of steps); the result is the last step's
            ``info["metrics"]``, which :func:`arborl.tools.metrics.episode_metrics` averages
            (e.g. F1, searches per question).

    Attributes:
        table: The tools by name.
        task: The current episode's task.
        steps: Turns taken in this episode.
        last_results: Result texts of the last turn's calls (what an expert may read).
        calls: This episode's executed calls: ``(name, arguments, result text)`` in order.
        tool_counts: Running ``calls``/``errors``/``timeouts`` per tool over the env's life.
        lifecycle: Stateful-tool instances ``created``, ``released`` and ``release_errors``.
    """

    def __init__(
        self,
        tasks: Sequence[Task] | Callable[[int], Task],
        tools: Sequence[Tool | StatefulTool],
        reward: RewardFn,
        *,
        call_format: CallFormat | None = None,
        max_steps: int = 8,
        call_timeout_s: float = 30.0,
        max_result_chars: int = 8_000,
        success_at: float = 1.0,
        instructions: str = "system",
        system_prompt: str | None = None,
        task_type: str = "tool",
        expert: Callable[[ToolEnv], str] | None = None,
        deterministic: bool = True,
        metrics: Callable[[ToolEnv, str | None], dict[str, float]] | None = None,
        format_instructions: str | None = None,
    ) -> None:
        if not callable(tasks) and not tasks:
            raise ValueError("ToolEnv: `tasks` is empty; pass at least one Task or a function seed -> Task")
        if max_steps < 1 or not call_timeout_s > 0:
            raise ValueError(f"ToolEnv: max_steps ({max_steps}) must be >= 1 and call_timeout_s ({call_timeout_s}) > 0")
        if instructions not in ("system", "user"):
            raise ValueError(f"ToolEnv: instructions is {instructions!r}; use 'system' or 'user'")
        self.table: dict[str, Tool | StatefulTool] = {}
        for t in tools:
            if t.name in self.table:
                raise ValueError(f"ToolEnv: two tools are named {t.name!r}; tool names must be unique")
            self.table[t.name] = t
        self.call_format = call_format or HermesFormat()
        wanted = getattr(self.call_format, "tool", None)
        if wanted is not None and wanted not in self.table:
            raise ValueError(f"ToolEnv: the {self.call_format.name} format calls a tool named {wanted!r}; "
                             f"add one to the tool table (have: {sorted(self.table)})")
        self.tasks, self.reward = tasks, reward
        self.max_steps, self.call_timeout_s = max_steps, call_timeout_s
        self.max_result_chars, self.success_at = max_result_chars, success_at
        self.instructions, self.system_prompt, self.task_type = instructions, system_prompt, task_type
        self.deterministic, self.metrics, self.format_instructions = deterministic, metrics, format_instructions
        if expert is not None:  # only an env with an expert has expert_action (check_env and synth look for it)
            self.expert_action: Callable[[], str] = lambda: expert(self)
        self.tool_counts: dict[str, dict[str, int]] = {}
        self.lifecycle = {"created": 0, "released": 0, "release_errors": 0}
        self._current: dict[str, Tool] = {}
        self._live: list[tuple[StatefulTool, Tool]] = []
        self.task: Task | None = None
        self._history: tuple[tuple[str, str], ...] = ()
        self.steps = 0
        self.last_results: list[str] = []
        self.calls: list[tuple[str, dict[str, Any], str]] = []

    # --- contract ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Release the previous episode's tool instances and start on the seed's task."""
        self._release_all()
        s = 0 if seed is None else int(seed)
        self.task = self.tasks(s) if callable(self.tasks) else self.tasks[s % len(self.tasks)]
        self._history, self.steps, self.last_results, self.calls = (), 0, [], []
        text = self.format_instructions or self.call_format.instructions(list(self.table.values()))
        if self.system_prompt:
            text = f"{self.system_prompt}\n\n{text}"
        if self.instructions == "user":
            return f"{text}\n\n{self.task.question}", {"task_id": self._task_id()}
        return [{"role": "system", "content": text}, {"role": "user", "content": self.task.question}], {
            "task_id": self._task_id()}

    def step(self, action: str) -> StepResult:
        """Run the turn's calls or score its answer; stateful tools are released when it ends."""
        if self.task is None:
            raise RuntimeError("ToolEnv: call reset() before step()")
        done = True  # also when _step raises: that episode is over for the rollout
        try:
            res = self._step(action)
            done = res.terminated or res.truncated
            return res
        finally:
            if done:
                self._release_all()

    def format_observation(self, obs: Any) -> str | list[dict[str, Any]]:
        """The first observation is chat messages (instructions, question); later ones are result text."""
        return obs if isinstance(obs, list) else str(obs)

    def state_key(self) -> Hashable:
        """The task and the valid calls made so far (equal keys: same question, same evidence)."""
        return (self._task_id(), self._history)

    def close(self) -> None:
        """Release any tool instances still held (idempotent)."""
        self._release_all()

    # --- one step ---------------------------------------------------------------------------
    def _step(self, action: str) -> StepResult:
        self.steps += 1
        parsed = self.call_format.parse(action if isinstance(action, str) else "")
        calls = list(parsed.calls)
        error = parsed.error or self._check_calls(calls)
        info: dict[str, Any] = {"action_valid": error is None}
        if calls:
            records = [{"name": c.name, "arguments": c.arguments, "call_id": f"call_{self.steps}_{i}"}
                       for i, c in enumerate(calls)]
            info["tool_call"], info["tool_calls"] = records[0], records
        out_of_steps = self.steps >= self.max_steps
        if error is not None:
            info.update(action=None, error=error, **({"success": False} if out_of_steps else {}))
            self._end_metrics(info, None, out_of_steps)
            return StepResult(f"Invalid action: {error}", 0.0, False, out_of_steps, info)
        if parsed.answer is not None:
            return self._score(parsed.answer, info)
        outcomes = [self._invoke(c) for c in calls]
        self.last_results = [o.text for o in outcomes]
        self.calls += [(c.name, c.arguments, o.text) for c, o in zip(calls, outcomes, strict=True)]
        self._history += tuple((c.name, json.dumps(c.arguments, sort_keys=True)) for c in calls)
        info["action"] = ",".join(c.name for c in calls)
        info["tool_results"] = [{"name": c.name, "result": o.text, "error": o.error, "timed_out": o.timed_out,
                                 "latency_s": o.latency_s} for c, o in zip(calls, outcomes, strict=True)]
        info["tool_latency_s"] = sum(o.latency_s for o in outcomes)
        info["tool_stats"] = self._count(calls, outcomes)
        failed = [f"{c.name}: {o.text}" for c, o in zip(calls, outcomes, strict=True) if o.error]
        if failed:
            info["error"] = "; ".join(failed)[:500]
        if out_of_steps:
            info["success"] = False
        self._end_metrics(info, None, out_of_steps)
        return StepResult(self.call_format.render([o.text for o in outcomes]), 0.0, False, out_of_steps, info)

    def _check_calls(self, calls: list[ParsedCall]) -> str | None:
        for c in calls:
            entry = self.table.get(c.name)
            if entry is None:
                return f"unknown tool {c.name!r}; the tools are {', '.join(sorted(self.table))}"
            problem = check_arguments(c.arguments, entry.parameters, c.name)
            if problem:
                return problem
        return None

    def _score(self, answer: str, info: dict[str, Any]) -> StepResult:
        assert self.task is not None
        reward = float(self.reward(answer, self.task))
        if not math.isfinite(reward):
            raise ValueError(f"ToolEnv: the reward function returned {reward!r} for {answer[:40]!r}; return a finite number")
        info.update(action="answer", answer=answer, success=reward >= self.success_at)
        self._end_metrics(info, answer, True)
        return StepResult("The episode is over.", reward, True, False, info)

    def _end_metrics(self, info: dict[str, Any], answer: str | None, ended: bool) -> None:
        """``info["metrics"]`` of the episode's last step (when a ``metrics`` function is given)."""
        if ended and self.metrics is not None:
            info["metrics"] = {str(k): float(v) for k, v in self.metrics(self, answer).items()}

    def _count(self, calls: list[ParsedCall], outcomes: list[_Outcome]) -> dict[str, dict[str, int]]:
        step: dict[str, dict[str, int]] = {}
        for c, o in zip(calls, outcomes, strict=True):
            for counts in (step.setdefault(c.name, _zero()), self.tool_counts.setdefault(c.name, _zero())):
                counts["calls"] += 1
                counts["errors"] += int(o.error)
                counts["timeouts"] += int(o.timed_out)
        return step

    # --- calls and instances ----------------------------------------------------------------
    def _instance(self, name: str) -> Tool:
        entry = self.table[name]
        if not callable(getattr(entry, "create", None)):
            return entry  # type: ignore[return-value]  # a plain Tool is shared
        if name not in self._current:
            inst = entry.create()  # type: ignore[union-attr]
            self.lifecycle["created"] += 1
            self._live.append((entry, inst))  # type: ignore[arg-type]
            self._current[name] = inst
        return self._current[name]

    def _invoke(self, call: ParsedCall) -> _Outcome:
        """Run one checked call under the deadline; every failure becomes result text."""
        t0 = time.perf_counter()
        try:
            fn = self._instance(call.name)
        except Exception as exc:  # a tool that cannot start fails this call, not the episode
            return _Outcome(f"ToolError: {call.name} could not start: {type(exc).__name__}: {exc}", error=True)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(call.arguments)
            except BaseException as exc:  # reported as the result; the thread must not die silently
                box["exc"] = exc

        worker = threading.Thread(target=run, name=f"tool-{call.name}", daemon=True)
        worker.start()
        worker.join(self.call_timeout_s)
        latency = time.perf_counter() - t0
        if worker.is_alive():
            self._current.pop(call.name, None)  # a hung instance is not used again (released at the end)
            return _Outcome(f"TimeoutError: {call.name} did not answer within {self.call_timeout_s:g} s",
                            error=True, timed_out=True, latency_s=latency)
        if "exc" in box:
            exc = box["exc"]
            return _Outcome(f"{type(exc).__name__}: {exc}", error=True, latency_s=latency)
        value = box.get("value")
        text = value if isinstance(value, str) else str(value)
        return _Outcome(truncate(text, self.max_result_chars), error=isinstance(value, ErrorResult), latency_s=latency)

    def _release_all(self) -> None:
        live, self._live, self._current = self._live, [], {}
        for entry, inst in live:
            try:
                entry.release(inst)
            except Exception:  # release is best effort; the episode's records are complete
                self.lifecycle["release_errors"] += 1
            self.lifecycle["released"] += 1

    def _task_id(self) -> str:
        return "" if self.task is None else (self.task.id or self.task.question)


def _zero() -> dict[str, int]:
    return {"calls": 0, "errors": 0, "timeouts": 0}
