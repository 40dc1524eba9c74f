"""How a model writes tool calls and reads results: two formats, chosen per recipe.

* :class:`SearchR1Format`: ``<search>query</search>`` calls the tool named ``search`` with
  ``{"query": query}``; results come back inside ``<information>...</information>``.
  Search-R1 (Jin et al., 2025) appends the results *inside* the assistant's continuation; here
  every call ends the turn and the results are the next user message, so the rollout's
  turn-by-turn masking applies unchanged (the tokens the model reads are the same text).
* :class:`HermesFormat`: the JSON function calling of Hermes/Qwen chat templates: one or more
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; each result comes back
  in its own ``<tool_response>...</tool_response>``, in a user message as those templates
  render a ``tool`` message, and the tool list is shown in ``<tools></tools>`` as JSON lines.

Both end an episode on ``<answer>...</answer>`` (a plain message is not taken as the final
answer: text that is neither a call nor an answer is an invalid action, so the model is told).

Parsing is strict and never raises; a :class:`ParsedTurn` with ``error`` set is an invalid
action whose message says what was wrong: an unterminated or stray tag, a tag nested in
another, a call and an answer in one turn, too many calls, a call longer than ``max_call_chars``,
bad JSON, a result tag written by the model. Tags inside tool *results* are escaped
(``<answer>`` -> ``&lt;answer>``) so a retrieved passage cannot close the result block or
plant an answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from arborl.config import ConfigError
from arborl.tools.base import Tool


@dataclass(frozen=True)
class ParsedCall:
    """One call as written: tool name and decoded arguments (checked against the tool later)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn asked for: calls, a final answer, or an error (an invalid action)."""

    calls: tuple[ParsedCall, ...] = ()
    answer: str | None = None
    error: str | None = None


class CallFormat(Protocol):
    """A tool-call syntax: instructions for the model, a parser, and the rendering of results."""

    name: str

    def instructions(self, tools: Sequence[Tool]) -> str:
        """Text that tells the model how to call ``tools`` and how to answer."""
        ...

    def parse(self, text: str) -> ParsedTurn:
        """The calls or answer in a model turn (never raises)."""
        ...

    def render(self, results: Sequence[str]) -> str:
        """The observation that shows ``results`` (one per call, in call order)."""
        ...


class _Problem(ValueError):
    pass


def tag_blocks(text: str, tags: Sequence[str]) -> list[tuple[str, str]]:
    """``(tag, content)`` of every ``<tag>...</tag>`` block, in order (tags matched case-insensitively).

    Raises:
        ValueError: A block is unterminated, a closing tag has no opening one, or a block holds
            another of ``tags`` (nested).
    """
    pattern = re.compile(r"<(/?)(" + "|".join(map(re.escape, tags)) + r")>", re.IGNORECASE)
    blocks: list[tuple[str, str]] = []
    open_tag, start = None, 0
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2).lower()
        if open_tag is None and closing:
            raise _Problem(f"</{tag}> without an opening <{tag}>")
        if open_tag is None:
            open_tag, start = tag, m.end()
        elif not closing or tag != open_tag:
            raise _Problem(f"<{m.group(1)}{tag}> inside <{open_tag}>: tags cannot be nested; close <{open_tag}> first")
        else:
            blocks.append((tag, text[start : m.start()]))
            open_tag = None
    if open_tag is not None:
        raise _Problem(f"unterminated <{open_tag}>: close it with </{open_tag}>")
    return blocks


def escape_tags(text: str, tags: Sequence[str]) -> str:
    """``text`` with every ``<tag>`` / ``</tag>`` of ``tags`` made inert (``<`` -> ``&lt;``)."""
    pattern = re.compile(r"<(/?\s*(?:" + "|".join(map(re.escape, tags)) + r"))\b", re.IGNORECASE)
    return pattern.sub(r"&lt;\1", text)


def _split_turn(text: str, call_tag: str, result_tag: str, max_calls: int) -> tuple[list[str], str | None]:
    """The call bodies and the answer of a turn; one kind of action per turn, no result tags."""
    if re.search(rf"</?{result_tag}>", text, re.IGNORECASE):
        raise _Problem(f"<{result_tag}> is written by the tools, not by you; call them with <{call_tag}>")
    blocks = tag_blocks(text, (call_tag, "answer"))
    calls = [body for tag, body in blocks if tag == call_tag]
    answers = [body for tag, body in blocks if tag == "answer"]
    if calls and answers:
        raise _Problem(f"a turn holds either <{call_tag}> calls or one <answer>, not both")
    if len(answers) > 1:
        raise _Problem("more than one <answer>; give one final answer")
    if len(calls) > max_calls:
        raise _Problem(f"{len(calls)} <{call_tag}> blocks in one turn; the limit is {max_calls}")
    if not calls and not answers:
        raise _Problem(f"no <{call_tag}> call and no <answer>: call a tool or give the final answer in <answer></answer>")
    if answers and not answers[0].strip():
        raise _Problem("the <answer> is empty")
    return calls, answers[0].strip() if answers else None


MAX_DEPTH = 32
"""Deepest nesting of call arguments accepted (checks below recurse; tool schemas are shallow)."""


def _depth(value: object) -> int:
    """Nesting depth of a decoded JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON; write a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large for a float")
    return value


@dataclass(frozen=True)
class SearchR1Format:
    """Search-R1 tags: ``<search>query</search>``, ``<information>`` results, ``<answer>``.

    Args:
        max_call_chars: Longest query accepted.
        tool: Name of the tool a ``<search>`` calls (its schema must take a ``query`` string).
    """

    max_call_chars: int = 1_000
    tool: str = "search"
    name: str = "search_r1"

    def instructions(self, tools: Sequence[Tool]) -> str:
        """Search-R1's protocol, in words."""
        return (
            "Answer the question. You may think inside <think></think> first. To look something up, "
            "write a query inside <search></search>, e.g. <search>capital of France</search>, and end your "
            "turn; the results come back inside <information></information>. Search as often as you need. "
            "When you know the answer, write only the answer inside <answer></answer>, e.g. <answer>Paris</answer>."
        )

    def parse(self, text: str) -> ParsedTurn:
        """One ``<search>`` block (a call) or one ``<answer>`` block."""
        try:
            calls, answer = _split_turn(text, "search", "information", 1)
        except _Problem as exc:
            return ParsedTurn(error=str(exc))
        if answer is not None:
            return ParsedTurn(answer=answer)
        query = " ".join(calls[0].split())
        if not query:
            return ParsedTurn(error="the <search> query is empty")
        if len(query) > self.max_call_chars:
            return ParsedTurn(error=f"the query is {len(query)} characters; the limit is {self.max_call_chars}")
        return ParsedTurn(calls=(ParsedCall(self.tool, {"query": query}),))

    def render(self, results: Sequence[str]) -> str:
        """``<information>results</information>`` (tags inside the results escaped)."""
        body = "\n".join(escape_tags(r, ("information", "search", "answer")).strip() for r in results)
        return f"<information>{body}</information>"


@dataclass(frozen=True)
class HermesFormat:
    """Hermes/Qwen JSON function calling: ``<tool_call>`` JSON blocks, ``<tool_response>`` results.

    Args:
        max_call_chars: Longest ``<tool_call>`` body accepted (checked before decoding JSON).
        max_calls: Most calls in one turn (parallel calls run in order).
    """

    max_call_chars: int = 4_000
    max_calls: int = 4
    name: str = "hermes"

    def instructions(self, tools: Sequence[Tool]) -> str:
        """The tool list as JSON lines in ``<tools>``, and how to call and answer."""
        lines = "\n".join(
            json.dumps({"type": "function", "function": {"name": t.name, "description": t.description,
                                                         "parameters": t.parameters}}, ensure_ascii=False)
            for t in tools
        )
        return (
            "# Tools\n\nYou can call functions to help with the question. Their signatures are listed inside "
            f"<tools></tools>:\n<tools>\n{lines}\n</tools>\n\nTo call one, write a JSON object with its name and "
            "arguments inside <tool_call></tool_call>:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "and end your turn; each result comes back inside <tool_response></tool_response>. When you know "
            "the answer, write only the answer inside <answer></answer>."
        )

    def parse(self, text: str) -> ParsedTurn:
        """Up to ``max_calls`` ``<tool_call>`` blocks, or one ``<answer>`` block."""
        try:
            bodies, answer = _split_turn(text, "tool_call", "tool_response", self.max_calls)
            if answer is not None:
                return ParsedTurn(answer=answer)
            return ParsedTurn(calls=tuple(self._call(b, i) for i, b in enumerate(bodies)))
        except _Problem as exc:
            return ParsedTurn(error=str(exc))

    def _call(self, body: str, i: int) -> ParsedCall:
        where, body = f"<tool_call> {i + 1}", body.strip()
        if len(body) > self.max_call_chars:
            raise _Problem(f"{where} is {len(body)} characters; the limit is {self.max_call_chars}")
        try:
            obj = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
        except RecursionError:
            raise _Problem(f"{where} is nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            pos = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise _Problem(f"{where} is not valid JSON ({msg}{pos})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            raise _Problem(f'{where} must be a JSON object {{"name": "<tool>", "arguments": {{...}}}}')
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some templates emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                raise _Problem(f"{where}: \"arguments\" is a string that is not a JSON object") from None
        if not isinstance(args, dict):
            raise _Problem(f'{where}: "arguments" must be a JSON object, got {type(args).__name__}')
        if _depth(args) > MAX_DEPTH:
            raise _Problem(f"{where} is nested deeper than {MAX_DEPTH} levels")
        return ParsedCall(obj["name"], args)

    def render(self, results: Sequence[str]) -> str:
        """One ``<tool_response>`` per result (tags inside the results escaped)."""
        tags = ("tool_response", "tool_call", "answer")
        return "\n".join(f"<tool_response>\n{escape_tags(r, tags).strip()}\n</tool_response>" for r in results)


FORMATS: dict[str, type[SearchR1Format] | type[HermesFormat]] = {"search_r1": SearchR1Format, "hermes": HermesFormat}
"""Formats by the name a recipe gives (``tool_format = "hermes"``)."""


@dataclass(frozen=True)
class CompactHermes:
    """Hermes JSON calls and ``<tool_response>`` results, with a one-line-per-tool prompt.

    The calls, parsing and results are :class:`~arborl.tools.formats.HermesFormat`'s; only the
    instructions are shorter (the tool names and argument names, no JSON schemas), so a small
    from-scratch policy's context holds the statement rather than the protocol. A real instruct
    model gets the full Hermes prompt (:func:`hermes_format` ``"hermes"``).
    """

    hermes: HermesFormat = field(default_factory=HermesFormat)
    name: str = "hermes"

    def instructions(self, tools: Sequence[Any]) -> str:
        """One line per tool and the call and answer syntax."""
        lines = " ; ".join(f"{t.name} ( {' , '.join(t.parameters.get('properties', {}))} ) : {t.description}" for t in tools)
        return (f"Tools : {lines} . Call : <tool_call> {{\"name\": ..., \"arguments\": {{...}}}} </tool_call> . "
                "Answer : <answer> ... </answer> .")

    def parse(self, text: str) -> ParsedTurn:
        """As :meth:`HermesFormat.parse`."""
        return self.hermes.parse(text)

    def render(self, results: Sequence[str]) -> str:
        """As :meth:`HermesFormat.render`."""
        return self.hermes.render(results)


def hermes_format(tool_prompt: str) -> HermesFormat | CompactHermes:
    """The Hermes call format a tool recipe's ``env.kwargs.tool_prompt`` names.

    ``"hermes"``: the full prompt with the tools' JSON schemas (what a real instruct model's chat
    template expects); ``"compact"``: :class:`CompactHermes`'s one line per tool.

    Raises:
        ConfigError: any other value.
    """
    if tool_prompt == "hermes":
        return HermesFormat()
    if tool_prompt == "compact":
        return CompactHermes()
    raise ConfigError(f"env.kwargs.tool_prompt = {tool_prompt!r}; use 'hermes' or 'compact'")
