"""FinQA execution accuracy: a hand-made table of answer strings and their scores; gold answers score 1.0."""

from __future__ import annotations

import pytest

from arborl.finqa.data import KINDS, generate_example
from arborl.finqa.reward import parse_answer, score

# (answer string, gold, unit, expected reward, parsed?)
TABLE = [
    ("150", 150.0, "", 1.0, True),
    ("151.4", 150.0, "", 1.0, True),          # 0.93% off: inside 1e-2
    ("151.6", 150.0, "", 0.0, True),          # 1.07% off
    ("148.6", 150.0, "", 1.0, True),
    ("$150", 150.0, "", 1.0, True),
    ("$1,250", 1250.0, "", 1.0, True),
    ("1,250 million", 1250.0, "", 1.0, True),
    ("(25)", -25.0, "", 1.0, True),           # accounting negative
    ("-25", -25.0, "", 1.0, True),
    ("25", -25.0, "", 0.0, True),             # sign matters
    ("-$25", -25.0, "", 1.0, True),
    ("12.5%", 12.5, "%", 1.0, True),
    ("12.5 %", 12.5, "%", 1.0, True),
    ("12.5", 12.5, "%", 1.0, True),
    ("0.125", 12.5, "%", 1.0, True),          # the fraction form of a percentage
    ("12.5 percent", 12.5, "%", 1.0, True),
    ("13", 12.5, "%", 0.0, True),             # 4% off
    ("45%", 0.45, "", 1.0, True),             # a ratio written as a percentage
    ("45", 0.45, "", 0.0, True),
    ("1.2e3", 1200.0, "", 1.0, True),
    ("0", 0.0, "", 1.0, True),
    ("0.001", 0.0, "", 0.0, True),            # a zero gold needs zero
    ("", 150.0, "", 0.0, False),
    ("about 150", 150.0, "", 0.0, False),
    ("150 or 151", 150.0, "", 0.0, False),
    ("one hundred", 100.0, "", 0.0, False),
    ("12.5%%", 12.5, "%", 0.0, False),
    ("nan", 1.0, "", 0.0, False),
    ("inf", 1.0, "", 0.0, False),
    ("1e999", 1.0, "", 0.0, False),           # overflows to inf
    ("$", 1.0, "", 0.0, False),
]


@pytest.mark.parametrize(("text", "gold", "unit", "expected", "parsed"), TABLE)
def test_answer_table(text, gold, unit, expected, parsed):
    assert score(text, gold, unit) == (expected, parsed)


def test_parse_answer_values():
    assert parse_answer(" $1,250.5 ") == (1250.5, False)
    assert parse_answer("(1,000)") == (-1000.0, False)
    assert parse_answer("3.5 pp") == (3.5, True)
    assert parse_answer("7 percentage points") == (7.0, True)


@pytest.mark.parametrize("test", [False, True])
def test_every_gold_answer_scores_one(test):
    """The exact gold, the rounded answer string and the calculator's rounded result all score 1.0."""
    from arborl.tools.calculator import calculator

    seen = set()
    for seed in range(3000):
        ex = generate_example(seed, test=test)
        seen.add(ex.kind)
        assert score(str(ex.exe_ans), ex.exe_ans, ex.unit) == (1.0, True), ex
        assert score(ex.answer, ex.exe_ans, ex.unit) == (1.0, True), ex
        assert score(calculator(ex.expression), ex.exe_ans, ex.unit) == (1.0, True), ex
        assert score(calculator(ex.flawed_expression), ex.exe_ans, ex.unit)[0] == 0.0, ex  # the teacher's slip is wrong
    assert seen == set(KINDS)
