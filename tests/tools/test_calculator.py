"""The calculator: a hand-computed table, refusals by node type, and bounded work."""

from __future__ import annotations

import time

import pytest

from arborl.tools import CALCULATOR, ErrorResult
from arborl.tools.calculator import CalculatorError, evaluate


@pytest.mark.parametrize(("expr", "shown"), [
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("(1250 - 1000) / 1000 * 100", "25"),       # a growth rate in percent
    ("7 / 2", "3.5"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("7 % 3", "1"),
    ("-3 ** 2", "-9"),                           # ** binds tighter than unary minus, as in Python
    ("(-3) ** 2", "9"),
    ("2 ** -1", "0.5"),
    ("2 ** 10", "1024"),
    ("0.1 + 0.2", "0.3"),                        # 12 significant digits
    ("1 / 3", "0.333333333333"),
    ("round(2.567, 2)", "2.57"),
    ("round(2.5)", "2"),                         # banker's rounding, as Python's round
    ("abs(-4.5)", "4.5"),
    ("min(3, 1, 2)", "1"),
    ("max(3, 1, 2)", "3"),
    ("sqrt(16)", "4"),
    ("+5", "5"),
    ("(" * 100 + "1" + ")" * 100, "1"),
    ("1e3 * 2", "2000"),
    ("123456789 * 987654321", "121932631112635269"),  # integers stay exact
])
def test_table(expr, shown):
    out = CALCULATOR({"expression": expr})
    assert out == shown and not isinstance(out, ErrorResult)


@pytest.mark.parametrize(("expr", "error"), [
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("__import__('os').system('true')", "calling \"__import__('os').system\" is not allowed"),
    ("open('/etc/passwd')", "calling 'open' is not allowed"),
    ("x + 1", "name 'x' is not allowed"),
    ("(1).__class__", "Attribute is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("1 < 2", "Compare is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("True + 1", "Constant is not allowed"),
    ("1j", "Constant is not allowed"),
    ("round(x=1)", "round() takes 1..2 positional arguments"),
    ("min(1)", "min() takes 2..64 positional arguments"),
    ("round(1.5, 0.5)", "round(x, n) needs an integer n"),
    ("9 ** 9 ** 9", "exponent 3.8742e+08 is larger than 1000"),
    ("10 ** 10 ** 10", "exponent 1e+10 is larger than 1000"),
    ("2 ** 5000", "exponent 5000 is larger than 1000"),
    ("99 ** 999", "result too large (over 4096 bits)"),
    ("(2 ** 1000) * (2 ** 1000) * (2 ** 1000) * (2 ** 1000) * (2 ** 1000)", "result too large (over 4096 bits)"),
    ("10.0 ** 400", "result too large"),
    ("1e308 * 10", "result is not a finite number"),
    ("(-8) ** 0.5", "not a real number"),
    ("sqrt(-1)", "math domain error"),
    ("1 +", "not an arithmetic expression (SyntaxError)"),
    ("(" * 240 + "1" + ")" * 240, "not an arithmetic expression (SyntaxError)"),  # parser nesting limit
    ("1+" * 300 + "1", "the limit is 500"),
])
def test_refusals_are_error_results(expr, error):
    out = CALCULATOR({"expression": expr})
    assert isinstance(out, ErrorResult)
    assert out.startswith("CalculatorError: ") and error in out, out


def test_huge_exponents_are_refused_before_any_work():
    t0 = time.perf_counter()
    for expr in ("9 ** 9 ** 9 ** 9", "2 ** 1000 ** 1000", "(10 ** 1000) ** 1000"):
        with pytest.raises(CalculatorError):
            evaluate(expr)
    assert time.perf_counter() - t0 < 0.5
