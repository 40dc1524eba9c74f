"""@tool: JSON schemas from type hints and docstrings (hand-written expectations), argument checks."""

from __future__ import annotations

from typing import Literal

import pytest

from arborl.tools import ErrorResult, tool
from arborl.tools.schema import check_arguments, parse_docstring


@tool
def lookup(city: str, year: int = 2024, unit: Literal["people", "thousands"] = "people",
           ratio: float | None = None, tags: list[str] | None = None, exact: bool = False) -> dict:
    """Population of a city in a census year.

    A second paragraph that is not part of the description.

    Args:
        city: City name, e.g. "Lyon".
        year (int): Census year; the data
            starts in 1900.
        unit: How to count.
        ratio: Optional scale factor.
        tags: Labels to attach.
        exact: Whether to refuse estimates.

    Returns:
        The population record.
    """
    if year < 1900:
        raise ValueError(f"no census before 1900 (got {year})")
    return {"city": city, "year": year, "unit": unit, "ratio": ratio, "tags": tags, "exact": exact}


def test_schema_from_hints_and_docstring_is_exactly_the_hand_written_one():
    assert lookup.name == "lookup"
    assert lookup.description == "Population of a city in a census year."
    assert lookup.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": 'City name, e.g. "Lyon".'},
            "year": {"type": "integer", "description": "Census year; the data starts in 1900.", "default": 2024},
            "unit": {"type": "string", "enum": ["people", "thousands"], "description": "How to count.",
                     "default": "people"},
            "ratio": {"type": ["number", "null"], "description": "Optional scale factor.", "default": None},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "description": "Labels to attach.",
                     "default": None},
            "exact": {"type": "boolean", "description": "Whether to refuse estimates.", "default": False},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


def test_nested_containers_and_decorator_options():
    @tool(name="grid-sum", description="Sum a grid.")
    def grid(rows: list[list[int]], weights: dict[str, float]) -> int:
        return sum(map(sum, rows))

    assert grid.name == "grid-sum" and grid.description == "Sum a grid."
    assert grid.parameters["properties"] == {
        "rows": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "weights": {"type": "object", "additionalProperties": {"type": "number"}},
    }
    assert grid.parameters["required"] == ["rows", "weights"]
    assert grid({"rows": [[1, 2], [3]], "weights": {}}) == "6"
    assert grid({"rows": [[1, "2"]], "weights": {}}) == "ArgumentError: argument 'rows'[0][1] must be integer, got string \"2\""


def test_call_checks_types_before_calling_and_errors_are_results_not_exceptions():
    ok = lookup({"city": "Lyon", "year": 1950})
    assert ok == '{"city": "Lyon", "year": 1950, "unit": "people", "ratio": null, "tags": null, "exact": false}'
    assert not isinstance(ok, ErrorResult)
    cases = {
        "missing": ({}, "ArgumentError: the call to lookup is missing required argument 'city'"),
        "str for int": ({"city": "x", "year": "1950"}, "ArgumentError: argument 'year' must be integer, got string \"1950\""),
        "bool for int": ({"city": "x", "year": True}, "ArgumentError: argument 'year' must be integer, got boolean true"),
        "float for int": ({"city": "x", "year": 1950.5}, "ArgumentError: argument 'year' must be integer, got number 1950.5"),
        "enum": ({"city": "x", "unit": "cats"}, 'ArgumentError: argument \'unit\' must be one of ["people", "thousands"], got "cats"'),
        "unknown": ({"city": "x", "zip": 1}, "ArgumentError: the call to lookup has unknown argument 'zip' (arguments: city, exact, ratio, tags, unit, year)"),
        "not an object": (["Lyon"], "ArgumentError: the arguments of lookup must be a JSON object, got array"),
        "raises": ({"city": "x", "year": 1800}, "ValueError: no census before 1900 (got 1800)"),
    }
    for what, (args, expected) in cases.items():
        out = lookup(args)
        assert out == expected, what
        assert isinstance(out, ErrorResult), what
    assert lookup({"city": "x", "ratio": 2, "tags": None})  # int is a number; null is allowed for X | None
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert lookup({"city": "x", "tags": deep}) == "ArgumentError: the arguments are nested too deeply"


def test_untypable_functions_are_refused_at_decoration_with_the_fix():
    def no_hint(x):
        return x

    def variadic(*xs: int):
        return xs

    def bad_type(x: set[int]):
        return x

    def typo(x: int):
        """Doc.

        Args:
            y: not a parameter.
        """

    with pytest.raises(TypeError, match="add a type annotation"):
        tool(no_hint)
    with pytest.raises(TypeError, match=r"\*args"):
        tool(variadic)
    with pytest.raises(TypeError, match=r"use str, int, float, bool, list\[...\]"):
        tool(bad_type)
    with pytest.raises(TypeError, match=r"Args: names \['y'\]"):
        tool(typo)
    with pytest.raises(TypeError, match="must match"):
        tool(lookup.fn, name="has space")


def test_check_arguments_reads_mcp_style_schemas_with_any_of():
    schema = {"type": "object", "properties": {"n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "N"}},
              "required": ["n"]}
    assert check_arguments({"n": 3}, schema, "t") is None
    assert check_arguments({"n": None}, schema, "t") is None
    assert check_arguments({"n": "3"}, schema, "t") == "argument 'n' does not match any of the allowed forms (got string)"
    assert check_arguments({"n": 1, "extra": 2}, schema, "t") is None  # additionalProperties defaults to allowed


def test_parse_docstring_sections():
    summary, args = parse_docstring("""Do a thing
    over two lines.

    Args:
        a: First.
        **kw: Rest.

    Raises:
        ValueError: never an argument.
    """)
    assert summary == "Do a thing over two lines."
    assert args == {"a": "First.", "kw": "Rest."}
