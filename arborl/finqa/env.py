"""The FinQA tool task: a statement and a question, a calculator and a sandboxed ``python`` tool.

``finqa_env(**kwargs)`` (the recipe's ``env.cls = "arborl.finqa.env:finqa_env"``) returns a
:class:`~arborl.env.tool_env.ToolEnv` composed of

* a **task source**: seed -> :class:`~arborl.env.tool_env.Task`. Seeds below ``heldout_from``
  are training questions, the others held out (disjoint companies, see :mod:`arborl.finqa.data`).
  Generated on the fly from the seed, or read from ``train_file`` / ``test_file`` (JSONL);
* a **tool table**: the calculator (:func:`arborl.tools.calculator.calculator`, with a short
  description) and, unless
  ``sandbox = "none"``, the ``python`` tool on a sandbox of the chosen backend, created on the
  first ``python`` call of an episode and closed when the episode ends;
* a **reward**: :func:`arborl.finqa.reward.score` (1.0 within relative tolerance 1e-2).

The oracle expert (for ``synth``) calls the calculator with the question's gold expression and
then answers with the calculator's result. With ``oracle_error = p`` it is a weaker teacher: on a
share ``p`` of the questions (chosen by a hash of the question id) it calls the example's
*flawed* expression instead (e.g. a growth rate divided by the later year), so the
demonstrations are imperfect and RL has something to fix. Such an env says
``deterministic = False`` (its expert is not always right, so ``check_env`` does not hold it to
success).

With ``spaced_digits = True`` every number the model reads (statement, question, tool results) is
written digit by digit and what it writes (the calculator expression, python code, the answer) is
read back the same way (:mod:`arborl.finqa.digits`): for a word-level tokenizer, whose numbers are
otherwise one rare word each. With ``whole_labels = True`` as well, the table's column labels
(the years) stay one word each in the statement and the question, so a cell's key is two words
(``revenue 2020``) and its value a digit copy (``revenue 2020 6 0 9``).

The env also has ``vocabulary`` (every number word a table, result or answer can hold, for
a from-scratch word-level tokenizer; the digits and ``|`` with ``spaced_digits``) and
``episode_metrics(episodes)``: parse failures and tool calls per question of evaluated episodes
(``summary.json`` holds them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from arborl.config import ConfigError
from arborl.env.tool_env import Task, ToolEnv
from arborl.finqa import digits
from arborl.finqa.data import YEARS, Example, generate_example, number_words, read_jsonl, render_document
from arborl.finqa.digits import WORDS, joined_digits, spaced_digits
from arborl.finqa.reward import score
from arborl.sandbox import BACKENDS, Sandbox
from arborl.tools.base import ErrorResult, Tool
from arborl.tools.calculator import calculator as evaluate_expression
from arborl.tools.formats import hermes_format
from arborl.tools.function import FunctionTool
from arborl.tools.python_tool import PythonTool

INSTRUCTIONS = "Answer with a number . Use the calculator ."


class DigitSpaced:
    """A tool that reads its string arguments with :func:`joined_digits` and answers with :func:`spaced_digits`.

    Args:
        tool: The wrapped tool (its name, description and parameters are this tool's).
    """

    def __init__(self, tool: Tool) -> None:
        self.tool, self.name, self.description, self.parameters = tool, tool.name, tool.description, tool.parameters

    def __call__(self, arguments: dict[str, Any]) -> str:
        """The wrapped tool's result for the joined arguments, its numbers spaced (an error stays an error)."""
        out = self.tool({k: joined_digits(v) if isinstance(v, str) else v for k, v in arguments.items()})
        return ErrorResult(spaced_digits(out)) if isinstance(out, ErrorResult) else spaced_digits(out)


class SandboxedPython:
    """The ``python`` tool as a stateful tool: one sandbox per episode, made on its first call.

    Args:
        backend: A sandbox backend name (see :data:`arborl.sandbox.BACKENDS`).
        wall_s: Wall-clock limit of one run.
        spaced: Code and output with numbers digit by digit (:class:`DigitSpaced`).
    """

    name = PythonTool.name
    description = "Run Python code in a fresh sandbox and return what it prints."
    parameters = {**PythonTool.parameters, "properties": {"code": {"type": "string"}}}

    def __init__(self, backend: str, wall_s: float = 5.0, spaced: bool = False) -> None:
        self.backend, self.wall_s, self.spaced = backend, wall_s, spaced

    def create(self) -> PythonTool | DigitSpaced:
        """A python tool on a fresh sandbox."""
        from arborl.sandbox import Limits

        tool = PythonTool(Sandbox(backend=self.backend, limits=Limits(wall_s=self.wall_s)))
        return DigitSpaced(tool) if self.spaced else tool

    def release(self, instance: PythonTool | DigitSpaced) -> None:
        """Close the episode's sandbox."""
        inner = instance.tool if isinstance(instance, DigitSpaced) else instance
        inner.sandbox.close()  # type: ignore[union-attr]


def calculator(expression: str) -> str:
    """Evaluate arithmetic and return the number.

    Args:
        expression: e.g. "round( ( 520 - 445 ) / 445 * 100 , 1 )".
    """
    return evaluate_expression(expression)


CALCULATOR = FunctionTool(calculator)
"""The landed safe calculator, with a description short enough for a small policy's context."""


@functools.lru_cache(maxsize=8)
def _file(path: str) -> tuple[Example, ...]:
    return tuple(read_jsonl(path))


def _hash01(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def task_of(ex: Example, spaced: bool = False, whole_labels: bool = False) -> Task:
    """The :class:`Task` of an example: the statement and question as the user message.

    Args:
        ex: The example.
        spaced: Write the message's numbers digit by digit (:func:`spaced_digits`); the metadata
            (gold expressions) keeps them as they are, and ``metadata["spaced"]`` says so.
        whole_labels: With ``spaced``, the table's column labels (years) stay one word each.
    """
    question = f"{render_document(ex)}\nQuestion : {ex.question}"
    keep = frozenset(ex.table[0][1:]) if whole_labels else frozenset()
    return Task(spaced_digits(question, keep) if spaced else question, answer=ex.exe_ans, id=ex.id,
                metadata={"unit": ex.unit, "kind": ex.kind, "expression": ex.expression,
                          "flawed_expression": ex.flawed_expression, "spaced": spaced})


def calculator_call(expression: str) -> str:
    """The Hermes call text of one calculator call (spaces around the JSON, so each part is a word)."""
    return "<tool_call> " + json.dumps({"name": "calculator", "arguments": {"expression": f" {expression} "}}) + " </tool_call>"


def finqa_env(*, train_file: str = "", test_file: str = "", heldout_from: int = 1_000_000_000,
              test_frac: float = 0.2, oracle_error: float = 0.0, sandbox: str = "bwrap",
              max_steps: int = 4, instructions: str = "system", tool_prompt: str = "hermes",
              spaced_digits: bool = False, whole_labels: bool = False) -> ToolEnv:
    """The FinQA :class:`~arborl.env.tool_env.ToolEnv` (see the module docstring).

    Args:
        train_file: JSONL of training examples (default: generated from the seed).
        test_file: JSONL of held-out examples (default: generated).
        heldout_from: Seeds from here on are held-out questions (the recipe's ``env.eval_seed_start``).
        test_frac: Share of generated company names that are held out.
        oracle_error: Share of questions whose oracle demonstration uses the flawed expression.
        sandbox: Backend of the ``python`` tool's sandbox, or ``"none"`` for no python tool.
        max_steps: Turns per episode.
        instructions: Where the tool instructions go, ``"system"`` or ``"user"``.
        tool_prompt: ``"hermes"``: the Hermes prompt with the tools' JSON schemas (what a real
            model's chat template expects); ``"compact"``: :class:`CompactHermes`'s short one.
        spaced_digits: Numbers digit by digit in what the model reads and writes
            (:mod:`arborl.finqa.digits`; for a word-level scratch tokenizer, off for a real model).
        whole_labels: With ``spaced_digits``, the table's column labels (the years) stay one word
            each in the statement and the question (the generated years join the vocabulary).

    Raises:
        ConfigError: ``sandbox`` names an unknown backend, ``oracle_error`` is not a share, or
            ``spaced_digits`` or ``whole_labels`` is not a bool, or ``whole_labels`` is set
            without ``spaced_digits``.
        SchemaError: A data file is missing or malformed.
    """
    if sandbox != "none" and sandbox not in BACKENDS:
        raise ConfigError(f"env.kwargs.sandbox = {sandbox!r}; choose one of {sorted(BACKENDS)} or 'none'")
    if not 0 <= oracle_error <= 1:
        raise ConfigError(f"env.kwargs.oracle_error = {oracle_error}; give a share in [0, 1]")
    if not isinstance(spaced_digits, bool):
        raise ConfigError(f"env.kwargs.spaced_digits = {spaced_digits!r}; use true or false")
    if not isinstance(whole_labels, bool):
        raise ConfigError(f"env.kwargs.whole_labels = {whole_labels!r}; use true or false")
    if whole_labels and not spaced_digits:
        raise ConfigError("env.kwargs.whole_labels = true needs spaced_digits = true (without it every number is one word)")
    train = _file(train_file) if train_file else None
    test = _file(test_file) if test_file else None

    def example(seed: int) -> Example:
        held = seed >= heldout_from
        pool = test if held else train
        k = seed - heldout_from if held else seed
        return pool[k % len(pool)] if pool else generate_example(k, test=held, test_frac=test_frac)

    def expert(env: ToolEnv) -> str:
        task = env.task
        assert task is not None
        if env.last_results:  # the result as the model read it (spaced when the env spaces numbers)
            return f"<answer> {env.last_results[-1].strip()} </answer>"
        flawed = _hash01(f"oracle-{task.id}") < oracle_error and task.metadata["flawed_expression"]
        expression = task.metadata["flawed_expression"] if flawed else task.metadata["expression"]
        if not expression:
            raise ConfigError(f"example {task.id!r} has no 'expression'; the oracle needs one for synth")
        return calculator_call(digits.spaced_digits(expression) if spaced else expression)

    spaced = spaced_digits  # the argument hides the function in this scope: digits.spaced_digits above
    tools: list[Any] = [DigitSpaced(CALCULATOR) if spaced else CALCULATOR]
    tools += [SandboxedPython(sandbox, spaced=spaced)] if sandbox != "none" else []
    env = ToolEnv(lambda seed: task_of(example(seed), spaced, whole_labels), tools, reward, call_format=hermes_format(tool_prompt),
                  max_steps=max_steps, system_prompt=INSTRUCTIONS, instructions=instructions,
                  task_type="finqa", expert=expert, deterministic=oracle_error == 0, call_timeout_s=10.0,
                  metrics=step_metrics)
    years = [str(y) for y in YEARS] if whole_labels else []
    env.vocabulary = [*WORDS, *years] if spaced else number_words()  # type: ignore[attr-defined]
    env.episode_metrics = episode_metrics  # type: ignore[attr-defined]
    return env


def reward(answer: str, task: Task) -> float:
    """FinQA execution accuracy of ``answer`` against the task's gold number (spaced digits joined first)."""
    return score(_read(answer, task), float(task.answer), task.metadata.get("unit", ""))[0]


def _read(text: str, task: Task) -> str:
    """What the model wrote, its numbers joined when the task spaces them."""
    return joined_digits(text) if task.metadata.get("spaced") else text


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def step_metrics(env: ToolEnv, answer: str | None) -> dict[str, float]:
    """Where an episode went wrong: the cells, the arithmetic, or the copy of the result.

    Returns:
        ``operands_right``: the first calculator call holds every number of the gold expression
        that is in the statement (constants such as ``* 100`` are not cells);
        ``result_right``: some calculator result scores 1.0 against the gold;
        ``answer_is_result`` (episodes that answered after a numeric calculator result): the
        answer equals the last such result. Each is 0 for an episode without a calculator call.
    """
    task = env.task
    assert task is not None
    expression = task.metadata.get("expression") or ""
    statement = _read(task.question.split("\nQuestion :")[0], task)
    cells = set(_NUMBER.findall(expression)) & set(_NUMBER.findall(statement))
    calcs = [(_read(str(args.get("expression", "")), task), _read(str(out), task))
             for name, args, out in env.calls if name == "calculator"]
    values = [float(v) for _, out in calcs if (v := out.replace(" ", "")) and _NUMBER.fullmatch(v)]
    out = {"operands_right": float(bool(calcs) and cells <= set(_NUMBER.findall(calcs[0][0]))),
           "result_right": float(any(reward(str(v), task) == 1.0 for v in values))}
    if answer is not None and values:
        out["answer_is_result"] = score(_read(answer, task), values[-1])[0]
    return out


def _final_answer(ep: Any) -> str | None:
    """The text of the episode's ``<answer>``, if its last turn gave one."""
    path = ep.path()
    if not path:
        return None
    return path[-1].info.get("answer") if path[-1].info.get("action") == "answer" else None


def episode_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """FinQA figures of evaluated episodes.

    Returns:
        ``parse_failures`` (answers that are not one number;
        count), ``unanswered`` (episodes that ended without an answer; count) and
        ``tool_calls_per_question`` (valid calls, mean) with ``calculator_calls_per_question``.
    """
    n = max(len(episodes), 1)
    parse_failures = unanswered = calls = calc = 0
    for ep in episodes:
        answer = _final_answer(ep)
        if answer is None:
            unanswered += 1
        else:
            parse_failures += int(not score(answer, 0.0)[1])
        for t in ep.path():
            names = [c["name"] for c in t.info.get("tool_calls", [])] if t.valid else []
            calls += len(names)
            calc += names.count("calculator")
    return {"parse_failures": float(parse_failures), "unanswered": float(unanswered),
            "tool_calls_per_question": calls / n, "calculator_calls_per_question": calc / n}
