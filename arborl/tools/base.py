"""The contract of a tool an agent can call: a name, a description, a JSON schema, a call.

Tools take the parsed JSON arguments of one tool call and return the text the model sees as the
tool result. A tool never raises for anything the model did (bad code, timeouts, bad
arguments): those become result text, so one bad call cannot end an episode or the trainer.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    """What a tool registry holds.

    Attributes:
        name: The function name the model calls (``[a-zA-Z0-9_-]+``).
        description: One paragraph shown to the model.
        parameters: JSON schema (``{"type": "object", ...}``) of the arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def __call__(self, arguments: dict[str, Any]) -> str:
        """Run the tool on parsed arguments and return the result text (never raises)."""
        ...


def truncate(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` characters with a visible ``...[truncated N bytes]`` marker."""
    if len(text) <= max_chars:
        return text
    dropped = len(text[max_chars:].encode("utf-8", errors="replace"))
    return text[:max_chars] + f"\n...[truncated {dropped} bytes]"


class ErrorResult(str):
    """Result text that reports a failed call (the tool raised, the arguments were wrong...).

    It is a ``str``, so a tool returning it keeps the :class:`Tool` contract; the tool
    environment tells it from a normal result by type and counts it as an error.
    """

    __slots__ = ()


class StatefulTool(Protocol):
    """A tool with per-episode state (a scratch dir, a database, a browser...).

    The tool environment calls ``create()`` on the first call of an episode, sends every call
    of that episode to the :class:`Tool` it returned, and calls ``release(instance)`` once when
    the episode ends, whatever ended it.

    Attributes:
        name: As for :class:`Tool`.
        description: As for :class:`Tool`.
        parameters: As for :class:`Tool`.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def create(self) -> Tool:
        """A fresh instance for one episode."""
        ...

    def release(self, instance: Tool) -> None:
        """Free what ``instance`` holds (called exactly once per created instance)."""
        ...
