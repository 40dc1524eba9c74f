"""Frozen-dataclass configs loaded from TOML with dotted ``key=value`` overrides.

A config is a tree of frozen dataclasses. :func:`load_config` reads a TOML file, applies
``--set`` overrides (``rl.lr=3e-4``, ``env.kwargs.size=5``, ``stages=["sft","rl"]``), and builds
the tree, checking every key and type. Errors name the key, the file, the expected type and the
fix; unknown keys come with the closest valid names.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import textwrap
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value``; the value is read as TOML (falls back to a plain string)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} has no '='; write it as key=value, e.g. rl.lr=3e-4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each dotted override set."""
    data = json.loads(json.dumps(data))
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a table")
            node = nxt
        node[path[-1]] = value
    return data


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_SCALARS: dict[type, tuple[str, Callable[[Any], bool]]] = {
    float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}
"""Scalar types a config field may have: what the error calls them, and which TOML values fit."""


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert a TOML value to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, key)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table for {tp.__name__}, got {value!r}")
        return build(tp, value, prefix=key + ".")
    if origin in (list, tuple):
        return _coerce_sequence(value, tp, key)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if tp in _SCALARS:
        what, fits = _SCALARS[tp]
        if not fits(value):
            raise ConfigError(f"{key}: expected {what}, got {value!r}")
        return float(value) if tp is float else value
    return value


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(value, a, key)
        except ConfigError:
            continue
    raise ConfigError(f"{key}: {value!r} is not a {_type_name(tp)}")


def _coerce_sequence(value: Any, tp: Any, key: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    inner = args[0] if args else Any
    items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def build(cls: type[T], data: dict[str, Any], *, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a dict, recursively, checking keys and types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        if k not in names:
            close = difflib.get_close_matches(k, names, n=3)
            hint = f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown config key {prefix + k!r}{hint} (valid keys here: {', '.join(names)})"
            )
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Read TOML ``path`` (or nothing), apply overrides, build ``cls``."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist; pass the path of a TOML file, e.g. examples/frozenlake.toml")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from e
    data = apply_overrides(data, overrides or [])
    try:
        return build(cls, data)
    except ConfigError as e:
        where = f"{path}: " if path else ""
        raise ConfigError(f"{where}{e}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config tree as plain dicts (for saving next to a run)."""
    return dataclasses.asdict(cfg)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstring of each field of dataclass ``cls`` (the string literal written under it).

    These docstrings are the single place a config field is documented; ``arborl config show``
    and ``arborl config keys`` print them.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (e.g. a class built at run time): no help text
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


@dataclass(frozen=True)
class KeyInfo:
    """One leaf key of a config tree, as ``arborl config keys|show`` print it."""

    key: str
    """Dotted key, e.g. ``rl.lr``."""
    type: str
    """The annotated type, as text."""
    default: Any
    """The value a config without this key gets."""
    value: Any
    """The value in the config that was walked (the default when walking the class)."""
    help: str
    """The field's attribute docstring ("" when it has none)."""


def config_keys(cfg: Any, *, prefix: str = "", default: Any = None) -> list[KeyInfo]:
    """Every leaf key under config ``cfg`` (a dataclass or an instance of one), in field order.

    A leaf is a field whose value is not itself a config dataclass (``env.kwargs`` is one leaf).
    ``default`` is the tree the defaults are read from (the class's own defaults when omitted).
    """
    if isinstance(cfg, type):
        cfg = cfg()
    cls = type(cfg)
    defaults = default if default is not None else cls()
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: list[KeyInfo] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value, base = getattr(cfg, f.name), getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            out += config_keys(value, prefix=f"{prefix}{f.name}.", default=base)
        else:
            out.append(KeyInfo(prefix + f.name, _type_name(hints[f.name]), base, value, docs.get(f.name, "")))
    return out
