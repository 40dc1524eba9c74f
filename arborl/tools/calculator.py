"""The ``calculator`` tool: arithmetic on numbers, evaluated on the syntax tree (no ``eval``).

Allowed: int and float literals, ``+ - * / // % **``, unary ``+``/``-``, parentheses, and the
functions ``round``, ``abs``, ``min``, ``max``, ``sqrt``. Anything else (names, attributes,
strings, comparisons, lambdas...) is refused by node type before anything is computed. Work is
bounded: the expression is at most :data:`MAX_CHARS` characters, an exponent at most
:data:`MAX_EXPONENT` in size, and no integer grows past :data:`MAX_BITS` bits, so ``9**9**9``
or ``10**10**10`` is an error, not a frozen worker.

Results: integers exactly, floats with 12 significant digits (``0.1 + 0.2`` -> ``0.3``).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from arborl.tools.function import FunctionTool

MAX_CHARS = 500
MAX_EXPONENT = 1_000
MAX_BITS = 4_096

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[int, int]]] = {
    "round": (round, (1, 2)), "abs": (abs, (1, 1)), "min": (min, (2, 64)), "max": (max, (2, 64)),
    "sqrt": (math.sqrt, (1, 1)),
}


class CalculatorError(ValueError):
    """The expression is not allowed arithmetic, or too big to compute; the message says which."""


def _number(value: Any) -> int | float:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"result too large (over {MAX_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value


def _power(base: int | float, exp: int | float) -> int | float:
    if abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exp:g} is larger than {MAX_EXPONENT}")
    big = isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1
    if big and exp * math.log2(abs(base)) > MAX_BITS:
        raise CalculatorError(f"result too large (over {MAX_BITS} bits)")
    result = base**exp
    if isinstance(result, complex):
        raise CalculatorError("a negative number to a fractional power is not a real number")
    return result


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _number(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _number(_power(left, right))
        return _number(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        fn, (lo, hi) = _FUNCTIONS[node.func.id]
        if node.keywords or not lo <= len(node.args) <= hi:
            raise CalculatorError(f"{node.func.id}() takes {lo}..{hi} positional arguments")
        args = [_eval(a) for a in node.args]
        if node.func.id == "round" and len(args) == 2 and not isinstance(args[1], int):
            raise CalculatorError("round(x, n) needs an integer n")
        return _number(fn(*args))
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = f"calling {ast.unparse(node.func)[:40]!r}"
    raise CalculatorError(
        f"{what} is not allowed; use numbers, + - * / // % **, parentheses and {', '.join(_FUNCTIONS)}"
    )


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression (see the module docstring for what is allowed).

    Raises:
        CalculatorError: Not allowed syntax, too long, too large, or a math error.
    """
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression is {len(expression)} characters; the limit is {MAX_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"not an arithmetic expression ({type(exc).__name__})") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, RecursionError):
        raise CalculatorError("result too large") from None
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(str(exc)) from None


def format_number(value: int | float) -> str:
    """An integer exactly; a float with 12 significant digits (``2.0`` -> ``2``)."""
    return str(value) if isinstance(value, int) else format(value, ".12g")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the number.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, and round, abs, min, max,
            sqrt; e.g. "(1250 - 1000) / 1000 * 100".
    """
    return format_number(evaluate(expression))


CALCULATOR = FunctionTool(calculator)
"""The calculator as a tool (``name == "calculator"``)."""
