"""Tools from typed Python functions: ``@tool``.

::

    @tool
    def lookup(city: str, year: int = 2024) -> str:
        '''Population of a city.

Args:
            city: City name, e.g. "Lyon".
            year: Census year.
        '''

The result is a :class:`FunctionTool` (a :class:`~arborl.tools.base.Tool`) whose ``parameters``
come from the type hints (:func:`~arborl.tools.schema.function_schema`). A call checks the
arguments against that schema first; wrong arguments and exceptions of the function come back
as :class:`~arborl.tools.base.ErrorResult` text, never as exceptions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, overload

from arborl.tools.base import ErrorResult
from arborl.tools.schema import check_arguments, function_schema


class FunctionTool:
    """A Python function as a :class:`~arborl.tools.base.Tool`.

    Args:
        fn: The function; every parameter annotated (see :func:`~arborl.tools.schema.annotation_schema`).
        name: Tool name (default ``fn.__name__``).
        description: Tool description (default: the docstring's summary).

    Attributes:
        name: The function name the model calls.
        description: Shown to the model.
        parameters: JSON schema of the arguments.
        fn: The wrapped function.
    """

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> None:
        spec = function_schema(fn, name=name, description=description)
        self.fn = fn
        self.name: str = spec["name"]
        self.description: str = spec["description"]
        self.parameters: dict[str, Any] = spec["parameters"]

    def __call__(self, arguments: dict[str, Any]) -> str:
        """Check ``arguments``, call the function, return its value as text (never raises)."""
        try:
            problem = check_arguments(arguments, self.parameters, self.name)
        except RecursionError:
            problem = "the arguments are nested too deeply"
        if problem:
            return ErrorResult(f"ArgumentError: {problem}")
        try:
            value = self.fn(**arguments)
        except Exception as exc:  # the model's arguments may make any function fail
            return ErrorResult(f"{type(exc).__name__}: {exc}")
        return result_text(value)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def result_text(value: Any) -> str:
    """A function's return value as tool-result text: str as is, JSON when it can be, else ``str()``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)


@overload
def tool(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> FunctionTool: ...


@overload
def tool(
    fn: None = None, *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(fn=None, *, name=None, description=None):
    """Make a :class:`FunctionTool`: ``tool(fn)``, ``@tool`` or ``@tool(name="...")``.

    Args:
        fn: The typed function (omit to get a decorator).
        name: Tool name (default ``fn.__name__``).
        description: Tool description (default: the docstring's summary).

    Returns:
        The tool, or a decorator that makes one.

    Raises:
        TypeError: A parameter has no JSON schema (the message names it and the allowed types).
    """
    if fn is None:
        return lambda f: FunctionTool(f, name=name, description=description)
    return FunctionTool(fn, name=name, description=description)
