"""The FinQA tool task: a statement and a question, a calculator and a sandboxed ``python`` tool.

``finqa_env(**kwargs)`` (the recipe's ``env.cls = "arborl.finqa.env:finqa_env"``) returns a
:class:`~arborl.env.tool_env.ToolEnv` composed of

* a **task source**: seed -> :class:`~arborl.env.tool_env.Task`. Seeds below ``heldout_from``
  are training questions, the others held out (disjoint companies, see :mod:`arborl.finqa.data`).
  Generated on the fly from the seed, or read from ``train_file`` / ``test_file`` (JSONL). The
  user message is the statement and the question, or with ``statement = False`` the company, the
  table's items and years and the question (no value: the cells come from ``lookup``);
* a **tool table**: the calculator (:func:`arborl.tools.calculator.calculator`, with a short
  description), with ``lookup = True`` the ``lookup(item, year)`` tool (:class:`TableLookup`: the
  cell of the current task's table, or an error observation naming the items or years there
  are) and, unless
  ``sandbox = "none"``, the ``python`` tool on a sandbox of the chosen backend, created on the
  first ``python`` call of an episode and closed when the episode ends;
* a **reward**: :func:`arborl.finqa.reward.score` (1.0 within relative tolerance 1e-2).

The oracle expert (for ``synth``, :func:`oracle`) calls the calculator with the question's gold
expression and then answers with the calculator's result; with ``lookup`` it first looks up each
cell the expression reads, one call a turn. With ``oracle_error = p`` it is a weaker teacher: on a
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
(``summary.json`` holds them, with the means of :func:`step_metrics`).
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from arborl.config import ConfigError
from arborl.env.split import stable_unit
from arborl.env.tool_env import Task, ToolEnv
from arborl.finqa.data import (
    YEARS,
    Example,
    expression_cells,
    generate_example,
    number_words,
    read_jsonl,
    render_document,
    render_index,
)
from arborl.finqa.digits import WORDS, joined_digits, spaced_digits
from arborl.finqa.reward import score
from arborl.sandbox import BACKENDS, Sandbox
from arborl.tools.base import ErrorResult, Tool
from arborl.tools.calculator import calculator as evaluate_expression
from arborl.tools.formats import hermes_format
from arborl.tools.function import FunctionTool
from arborl.tools.python_tool import PythonTool

INSTRUCTIONS = "Answer with a number . Use the calculator ."
LOOKUP_INSTRUCTIONS = "Look up the numbers , one call a turn . Then use the calculator . Then answer with its number ."


class DigitSpaced:
    """A tool that reads its string arguments with :func:`joined_digits` and answers with :func:`spaced_digits`.

    Args:
        tool: The wrapped tool (its name, description and parameters are this tool's).
        keep: Returns the numbers that stay one word in the result (see :func:`spaced_digits`).
    """

    def __init__(self, tool: Tool, keep: Callable[[], frozenset[str]] | None = None) -> None:
        self.tool, self.name, self.description, self.parameters = tool, tool.name, tool.description, tool.parameters
        self.keep = keep
        """Numbers the result keeps one word each (the current task's years, with ``whole_labels``)."""

    def __call__(self, arguments: dict[str, Any]) -> str:
        """The wrapped tool's result for the joined arguments, its numbers spaced (an error stays an error)."""
        out = self.tool({k: joined_digits(v) if isinstance(v, str) else v for k, v in arguments.items()})
        text = spaced_digits(out, self.keep() if self.keep else frozenset())
        return ErrorResult(text) if isinstance(out, ErrorResult) else text


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


def lookup_cell(table: Sequence[Sequence[str]], item: str, year: str) -> str:
    """The value of ``item`` in ``year`` of a FinQA table (header row first), or an error naming what exists.

    Item and year are matched after stripping spaces; the item ignores case.

    >>> t = [["item", "2019", "2020"], ["revenue", "500", "600"]]
    >>> lookup_cell(t, " revenue ", "2020"), lookup_cell(t, "Revenue", "2019")
    ('600', '500')
    >>> lookup_cell(t, "sales", "2020")
    "LookupError: no item 'sales' ; the items are revenue"
    """
    header, *rows = table
    years = [str(y).strip() for y in header[1:]]
    cells = {str(r[0]).strip().lower(): r[1:] for r in rows}
    row = cells.get(item.strip().lower())
    if row is None:
        return ErrorResult(f"LookupError: no item {item.strip()!r} ; the items are {' , '.join(str(r[0]) for r in rows)}")
    if year.strip() not in years:
        return ErrorResult(f"LookupError: no year {year.strip()!r} ; the years are {' , '.join(years)}")
    return str(row[years.index(year.strip())]).strip()


class TableLookup(FunctionTool):
    """The ``lookup`` tool: one cell of the current episode's table (a typed-function tool).

    Args:
        table: Returns the table of the episode being played (the env's current task's).
    """

    def __init__(self, table: Callable[[], Sequence[Sequence[str]]]) -> None:
        self.table = table
        super().__init__(self.lookup)

    def lookup(self, item: str, year: str) -> str:
        """Look up the value of an item in a year.

        Args:
            item: a line item, e.g. "revenue".
            year: a year of the table, e.g. "2020".
        """
        return lookup_cell(self.table(), item, year)


@functools.lru_cache(maxsize=8)
def _file(path: str) -> tuple[Example, ...]:
    return tuple(read_jsonl(path))


def task_of(ex: Example, spaced: bool = False, whole_labels: bool = False, statement: bool = True) -> Task:
    """The :class:`Task` of an example: the statement (or its index) and the question as the user message.

    Args:
        ex: The example.
        spaced: Write the message's numbers digit by digit (:func:`spaced_digits`); the metadata
            (gold expressions, table) keeps them as they are, and ``metadata["spaced"]`` says so.
        whole_labels: With ``spaced``, the table's column labels (years) stay one word each.
        statement: The statement's values in the message (:func:`render_document`); else only
            its items and years (:func:`render_index`), for the ``lookup`` tool to fetch.
    """
    question = f"{render_document(ex) if statement else render_index(ex)}\nQuestion : {ex.question}"
    keep = frozenset(ex.table[0][1:]) if whole_labels else frozenset()
    return Task(spaced_digits(question, keep) if spaced else question, answer=ex.exe_ans, id=ex.id,
                metadata={"unit": ex.unit, "kind": ex.kind, "expression": ex.expression,
                          "flawed_expression": ex.flawed_expression, "spaced": spaced, "table": ex.table, "question": ex.question,
                          "keep": keep})


def calculator_call(expression: str) -> str:
    """The Hermes call text of one calculator call (spaces around the JSON, so each part is a word)."""
    return "<tool_call> " + json.dumps({"name": "calculator", "arguments": {"expression": f" {expression} "}}) + " </tool_call>"


def lookup_call(item: str, year: str) -> str:
    """The Hermes call text of one ``lookup`` call (the item and the year each a word of their own)."""
    return "<tool_call> " + json.dumps({"name": "lookup", "arguments": {"item": f" {item} ", "year": f" {year} "}}) + " </tool_call>"


def finqa_env(*, train_file: str = "", test_file: str = "", heldout_from: int = 1_000_000_000,
              test_frac: float = 0.2, oracle_error: float = 0.0, sandbox: str = "bwrap",
              max_steps: int = 4, instructions: str = "system", tool_prompt: str = "hermes",
              spaced_digits: bool = False, whole_labels: bool = False, lookup: bool = False,
              statement: bool = True) -> ToolEnv:
    """The FinQA :class:`~arborl.env.tool_env.ToolEnv` (see the module docstring).

    Args:
        train_file: JSONL of training examples (default: generated from the seed).
        test_file: JSONL of held-out examples (default: generated).
        heldout_from: Seeds from here on are held-out questions (the recipe's ``env.eval_seed_start``).
        test_frac: Share of generated company names that are held out.
        oracle_error: Share of questions whose oracle demonstration uses the flawed expression.
        sandbox: Backend of the ``python`` tool's sandbox, or ``"none"`` for no python tool.
        max_steps: Turns per episode (with ``lookup``: one a cell, one for the calculator, one
            for the answer: 4 for a one-step question, 6 for a two-step one).
        instructions: Where the tool instructions go, ``"system"`` or ``"user"``.
        tool_prompt: ``"hermes"``: the Hermes prompt with the tools' JSON schemas (what a real
            model's chat template expects); ``"compact"``: :class:`CompactHermes`'s short one.
        spaced_digits: Numbers digit by digit in what the model reads and writes
            (:mod:`arborl.finqa.digits`; for a word-level scratch tokenizer, off for a real model).
        whole_labels: With ``spaced_digits``, the table's column labels (the years) stay one word
            each in the statement and the question (the generated years join the vocabulary).
        lookup: Add the ``lookup(item, year)`` tool (:class:`TableLookup`); the oracle looks up
            each cell its expression reads, one call a turn, before it calls the calculator.
        statement: The statement's values in the prompt; ``False`` leaves only the company,
            the items and the years (:func:`~arborl.finqa.data.render_index`), so the cells
            come from ``lookup``.

    Raises:
        ConfigError: ``sandbox`` names an unknown backend, ``oracle_error`` is not a share, or
            ``spaced_digits``, ``whole_labels``, ``lookup`` or ``statement`` is not a bool, or
            ``whole_labels`` is set without ``spaced_digits``, or neither ``statement`` nor
            ``lookup`` gives the model the table's values.
        SchemaError: A data file is missing or malformed.
    """
    _check_kwargs(sandbox, oracle_error, spaced_digits=spaced_digits, whole_labels=whole_labels, lookup=lookup,
                  statement=statement)
    train = _file(train_file) if train_file else None
    test = _file(test_file) if test_file else None

    def example(seed: int) -> Example:
        held = seed >= heldout_from
        pool = test if held else train
        k = seed - heldout_from if held else seed
        return pool[k % len(pool)] if pool else generate_example(k, test=held, test_frac=test_frac)

    spaced = spaced_digits  # the argument hides the module function in this scope
    holder: list[ToolEnv] = []  # the env, for the lookup tool to read its current task's table

    def current(key: str) -> Any:
        task = holder[0].task
        assert task is not None, "lookup called before reset()"
        return task.metadata[key]

    tools: list[Any] = [DigitSpaced(CALCULATOR) if spaced else CALCULATOR]
    if lookup:
        table = TableLookup(lambda: current("table"))
        tools.append(DigitSpaced(table, keep=lambda: current("keep")) if spaced else table)
    tools += [SandboxedPython(sandbox, spaced=spaced)] if sandbox != "none" else []
    env = ToolEnv(lambda seed: task_of(example(seed), spaced, whole_labels, statement), tools, reward,
                  call_format=hermes_format(tool_prompt), max_steps=max_steps,
                  system_prompt=LOOKUP_INSTRUCTIONS if lookup else INSTRUCTIONS, instructions=instructions,
                  task_type="finqa", expert=functools.partial(oracle, oracle_error=oracle_error, lookup=lookup),
                  deterministic=oracle_error == 0, call_timeout_s=10.0,
                  metrics=step_metrics)
    holder.append(env)
    env.random_action = functools.partial(random_action, env, lookup=lookup)  # type: ignore[attr-defined]
    years = [str(y) for y in YEARS] if whole_labels else []
    env.vocabulary = [*WORDS, *years] if spaced else number_words()  # type: ignore[attr-defined]
    env.episode_metrics = episode_metrics  # type: ignore[attr-defined]
    return env


def _check_kwargs(sandbox: str, oracle_error: float, **flags: Any) -> None:
    """The :func:`finqa_env` kwargs' rules (its ``Raises``)."""
    if sandbox != "none" and sandbox not in BACKENDS:
        raise ConfigError(f"env.kwargs.sandbox = {sandbox!r}; choose one of {sorted(BACKENDS)} or 'none'")
    if not 0 <= oracle_error <= 1:
        raise ConfigError(f"env.kwargs.oracle_error = {oracle_error}; give a share in [0, 1]")
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"env.kwargs.{key} = {value!r}; use true or false")
    if flags["whole_labels"] and not flags["spaced_digits"]:
        raise ConfigError("env.kwargs.whole_labels = true needs spaced_digits = true (without it every number is one word)")
    if not (flags["statement"] or flags["lookup"]):
        raise ConfigError("env.kwargs.statement = false needs lookup = true: without the statement or the lookup "
                          "tool the model never sees a value of the table")


def oracle(env: ToolEnv, *, oracle_error: float = 0.0, lookup: bool = False) -> str:
    """The expert's next action: (with ``lookup``) a lookup per cell, then the calculator, then the answer.

    The expression is the gold, or the flawed one on the ``oracle_error`` share of the questions
    (by a hash of the question id). With ``lookup`` each cell the expression reads
    (:func:`~arborl.finqa.data.expression_cells`) not fetched yet is looked up, one call a turn;
    then, unless the last call was the calculator, the calculator on the expression (whose numbers
    are the looked-up values); then the answer, the last result as the model read it.

    Raises:
        ConfigError: The task has no expression.
    """
    task = env.task
    assert task is not None
    flawed = stable_unit(f"oracle-{task.id}") < oracle_error and task.metadata["flawed_expression"]
    expression = task.metadata["flawed_expression"] if flawed else task.metadata["expression"]
    if not expression:
        raise ConfigError(f"example {task.id!r} has no 'expression'; the oracle needs one for synth")
    if lookup:
        done = {_cell_key(args, task) for name, args, _ in env.calls if name == "lookup"}
        cells = expression_cells(expression, task.metadata["table"], task.metadata["question"])
        todo = [c for c in cells if (c[0].lower(), c[1]) not in done]
        if todo:
            return lookup_call(_as_read(todo[0][0], task), _as_read(todo[0][1], task))
        if not env.calls or env.calls[-1][0] != "calculator":
            return calculator_call(_as_read(expression, task))
    elif not env.last_results:
        return calculator_call(_as_read(expression, task))
    return f"<answer> {env.last_results[-1].strip()} </answer>"


RANDOM_EXPRESSIONS = ("{a} - {b}", "{a} + {b}", "{a} / {b}", "( {a} - {b} ) / {b}", "{a} * {b}", "{a} / {b} - 1")


def random_action(env: ToolEnv, rng: random.Random, *, lookup: bool = False) -> str:
    """A well-formed action with plausible, mostly wrong arguments (mid-training's noisy synthesis).

    A ``lookup`` of a random cell of the task's table (with ``lookup``), a calculator call on one
    of :data:`RANDOM_EXPRESSIONS` over two random cells, or (after a result) the last result as
    the answer. The env runs each for real: the lookups and the calculator return real values.
    """
    task = env.task
    assert task is not None, "random_action called before reset()"
    header, *rows = task.metadata["table"]
    roll = rng.random()
    if lookup and roll < 0.5:
        return lookup_call(_as_read(rng.choice(rows)[0], task), _as_read(rng.choice(header[1:]), task))
    if roll < 0.85 or not env.last_results:
        a, b = (rng.choice(rows)[rng.randrange(1, len(header))] for _ in range(2))
        return calculator_call(_as_read(rng.choice(RANDOM_EXPRESSIONS).format(a=a, b=b), task))
    return f"<answer> {env.last_results[-1].strip()} </answer>"


def _as_read(text: str, task: Task) -> str:
    """``text`` as the task's prompt writes it (digits spaced, its years kept, when the task spaces numbers)."""
    return spaced_digits(text, task.metadata["keep"]) if task.metadata.get("spaced") else text


def _cell_key(arguments: dict[str, Any], task: Task) -> tuple[str, str]:
    """The ``(item, year)`` a lookup call asked for, as the table writes them (digits joined, spaces stripped)."""
    item, year = (_read(str(arguments.get(k, "")), task).strip() for k in ("item", "year"))
    return item.lower(), year


def reward(answer: str, task: Task) -> float:
    """FinQA execution accuracy of ``answer`` against the task's gold number (spaced digits joined first)."""
    return score(_read(answer, task), float(task.answer), task.metadata.get("unit", ""))[0]


def _read(text: str, task: Task) -> str:
    """What the model wrote, its numbers joined when the task spaces them."""
    return joined_digits(text) if task.metadata.get("spaced") else text


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def step_metrics(env: ToolEnv, answer: str | None) -> dict[str, float]:
    """Where an episode went wrong: the lookups, the cells, the arithmetic, or the copy of the result.

    The gold's cells are the table values :func:`~arborl.finqa.data.expression_cells` finds in
    the gold expression (constants such as ``* 100`` are not cells).

    Returns:
        ``operands_right``: the first calculator call holds every cell of the gold expression;
        ``result_right``: some calculator result scores 1.0 against the gold;
        ``answer_is_result`` (episodes that answered after a numeric calculator result): the
        answer equals the last such result. Each is 0 for an episode without a calculator call.
        With the ``lookup`` tool, ``lookups_right`` (episodes with a lookup): the share of the
        episode's lookups that fetched a cell of the gold, and ``lookups_complete``: every cell
        of the gold was fetched. ``right_<kind>``: the reward (0 unanswered), one name per
        question kind, so the mean over episodes is the accuracy of that kind.
    """
    task = env.task
    assert task is not None
    cells = _gold_cells(task)
    calcs = [(_read(str(args.get("expression", "")), task), _read(str(out), task))
             for name, args, out in env.calls if name == "calculator"]
    values = [float(v) for _, out in calcs if (v := out.replace(" ", "")) and _NUMBER.fullmatch(v)]
    out = {"operands_right": float(bool(calcs) and cells <= set(_NUMBER.findall(calcs[0][0]))),
           "result_right": float(any(reward(str(v), task) == 1.0 for v in values))}
    if answer is not None and values:
        out["answer_is_result"] = score(_read(answer, task), values[-1])[0]
    if "lookup" in env.table:
        fetched = [_read(str(res), task).strip() for name, _, res in env.calls if name == "lookup"]
        if fetched:
            out["lookups_right"] = sum(v in cells for v in fetched) / len(fetched)
        out["lookups_complete"] = float(cells <= set(fetched))
    if task.metadata.get("kind"):
        out[f"right_{task.metadata['kind']}"] = reward(answer, task) if answer is not None else 0.0
    return out


def _gold_cells(task: Task) -> set[str]:
    """The values of the table cells the task's gold expression reads."""
    table = task.metadata.get("table") or [[""]]
    rows = {r[0]: r for r in table[1:]}
    return {rows[item][table[0].index(year)].strip()
            for item, year in expression_cells(task.metadata.get("expression") or "", table, task.metadata.get("question", ""))}


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
        ``tool_calls_per_question`` (valid calls, mean) with ``calculator_calls_per_question``
        and ``lookup_calls_per_question``.
    """
    n = max(len(episodes), 1)
    parse_failures = unanswered = calls = calc = looked = 0
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
            looked += names.count("lookup")
    return {"parse_failures": float(parse_failures), "unanswered": float(unanswered),
            "tool_calls_per_question": calls / n, "calculator_calls_per_question": calc / n,
            "lookup_calls_per_question": looked / n}
