"""JSON schemas of tool arguments: built from type hints, and checked before a call.

:func:`function_schema` turns a typed Python function with a Google-style docstring into the
``{"name", "description", "parameters"}`` triple of OpenAI-style function calling.
:func:`check_arguments` checks parsed JSON arguments against any such ``parameters`` schema
(ours, or one an MCP server sends) and returns a one-line problem, or ``None``.

The checker covers the subset of JSON Schema that tool schemas use: ``type`` (one name or a
list), ``enum``, ``properties``, ``required``, ``additionalProperties: false``, ``items`` and
``anyOf``. Other keywords (``title``, ``format``, ``minimum``...) are not checked; the tool
itself still sees the value and may reject it in its result text.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTIONS = ("Args:", "Arguments:", "Returns:", "Return:", "Raises:", "Yields:", "Examples:", "Example:", "Note:")


def annotation_schema(annotation: Any, where: str) -> dict[str, Any]:
    """JSON schema of one parameter annotation.

    Args:
        annotation: ``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict[str, ...]``,
            ``Literal[...]`` or ``X | None`` of those.
        where: Names the parameter in the error message.

    Raises:
        TypeError: The annotation has no JSON counterpart (the message says which ones do).
    """
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is list or origin is list:
        return {"type": "array", **({"items": annotation_schema(args[0], where)} if args else {})}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: JSON object keys are strings; annotate as dict[str, ...]")
        return {"type": "object", **({"additionalProperties": annotation_schema(args[1], where)} if args else {})}
    if origin is Literal:
        kinds = {_SCALARS.get(type(v)) for v in args}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"{where}: Literal values must all be str, or all int/float/bool, got {args!r}")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = annotation_schema(rest[0], where)
            return {**inner, "type": [inner["type"], "null"]}
    raise TypeError(
        f"{where}: annotation {annotation!r} has no JSON schema; use str, int, float, bool, list[...], "
        "dict[str, ...], Literal[...] or X | None"
    )


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The summary paragraph(s) and the ``Args:`` descriptions of a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current, indent = None, None, None
    for line in lines:
        stripped = line.strip()
        if not line.startswith((" ", "\t")) and stripped in _SECTIONS:
            section, current, indent = stripped, None, None
            continue
        if section is None:
            summary.append(stripped)
        elif section in ("Args:", "Arguments:") and stripped:
            level = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(stripped)
            if match and (indent is None or level <= indent):
                indent, current = level, match.group(1).lstrip("*")
                args[current] = match.group(2).strip()
            elif current is not None:  # continuation line of the current argument
                args[current] = f"{args[current]} {stripped}".strip()
    text = "\n".join(summary).strip()
    return " ".join(text.split("\n\n")[0].split()) if text else "", args


def function_schema(fn: Callable[..., Any], *, name: str | None = None,
                    description: str | None = None) -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` of ``fn`` from its type hints and docstring.

    Args:
        fn: A function whose parameters are all annotated (see :func:`annotation_schema`).
        name: The tool name (default ``fn.__name__``).
        description: The tool description (default: the docstring's first paragraph).

    Raises:
        TypeError: A parameter is unannotated, variadic or of a type JSON cannot carry, the
            docstring documents a parameter ``fn`` does not have, or the name is not
            ``[a-zA-Z0-9_-]{1,64}``.
    """
    name = name or fn.__name__
    if not _NAME_RE.match(name):
        raise TypeError(f"tool name {name!r} must match [a-zA-Z0-9_-]{{1,64}}; pass name=...")
    summary, docs = parse_docstring(fn.__doc__)
    hints = typing.get_type_hints(fn)
    params = inspect.signature(fn).parameters
    unknown = sorted(set(docs) - set(params))
    if unknown:
        raise TypeError(f"tool {name}: the docstring's Args: names {unknown}, which {fn.__name__} has no parameter for")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in params.items():
        where = f"tool {name}, parameter {pname!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"{where}: *args, **kwargs and positional-only parameters cannot come from JSON")
        if pname not in hints:
            raise TypeError(f"{where}: add a type annotation (the JSON schema is built from it)")
        prop = annotation_schema(hints[pname], where)
        if pname in docs and docs[pname]:
            prop["description"] = docs[pname]
        if param.default is param.empty:
            required.append(pname)
        else:
            with contextlib.suppress(TypeError, ValueError):  # a default JSON cannot show is left out
                prop["default"] = json.loads(json.dumps(param.default, allow_nan=False))
        properties[pname] = prop
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"name": name, "description": description or summary, "parameters": parameters}


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _type_name(value: Any) -> str:
    for name, test in _JSON_TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _JSON_TYPES["number"](value) else type(value).__name__


def check_value(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """The first way ``value`` breaks ``schema`` as a one-line message, or ``None``."""
    if not isinstance(schema, dict):
        return None
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if isinstance(s, dict)]
        if options and all(check_value(value, s, where) for s in options):
            return f"{where} does not match any of the allowed forms (got {_type_name(value)})"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds and not any(_JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
        return f"{where} must be {' or '.join(kinds)}, got {_type_name(value)} {json.dumps(value)[:40]}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)[:40]}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = check_value(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict):
        return _check_object(value, schema, where)
    return None


def _check_object(value: dict[str, Any], schema: dict[str, Any], where: str) -> str | None:
    props = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or [] if k not in value]
    if missing:
        return f"{where} is missing required argument {missing[0]!r}"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if key not in props and extra is False:
            known = ", ".join(sorted(props)) or "none"
            return f"{where} has unknown argument {key!r} (arguments: {known})"
        problem = check_value(item, sub, f"argument {key!r}") if sub is not None else None
        if problem:
            return problem
    return None


def check_arguments(arguments: Any, parameters: dict[str, Any], tool: str) -> str | None:
    """Check parsed call arguments against a tool's ``parameters`` schema.

    Args:
        arguments: The decoded JSON arguments (must be an object).
        parameters: The tool's JSON schema.
        tool: The tool name, for the message.

    Returns:
        ``None`` when the arguments fit, else one line naming the argument and the problem.
    """
    if not isinstance(arguments, dict):
        return f"the arguments of {tool} must be a JSON object, got {_type_name(arguments)}"
    return check_value(arguments, {**parameters, "type": "object"}, f"the call to {tool}")
