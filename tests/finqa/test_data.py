"""The statement generator: determinism, consistency, the held-out split, the closed set of number words, JSONL."""

from __future__ import annotations

import json

import pytest

from arborl.finqa.data import (
    ITEMS,
    example_from_json,
    generate_example,
    is_held_out,
    main,
    number_words,
    read_jsonl,
    render_document,
    write_jsonl,
)
from arborl.finqa.reward import parse_answer
from arborl.tools.calculator import calculator, evaluate
from arborl.trajectory.schema import SchemaError


def test_same_seed_same_example_and_seeds_differ():
    assert generate_example(7, test=False) == generate_example(7, test=False)
    assert generate_example(7, test=False) != generate_example(8, test=False)


def test_statements_are_consistent_and_programs_match_the_table():
    for seed in range(300):
        ex = generate_example(seed, test=False)
        header, *rows = ex.table
        t = {r[0]: [int(v) for v in r[1:]] for r in rows}
        assert list(t) == list(ITEMS) and all(1 <= v <= 999 for row in t.values() for v in row)
        assert t["income"] == [r - c - e for r, c, e in zip(t["revenue"], t["costs"], t["expenses"], strict=True)]
        assert [int(y) for y in header[1:]] == list(range(int(header[1]), int(header[1]) + len(header) - 1))
        # every operand of the gold expression is a table number (the model copies operands, not computes them)
        operands = {w for w in ex.expression.replace("(", " ").replace(")", " ").split() if w.isdigit()}
        assert operands - {"100", "1", "2"} <= {str(v) for row in t.values() for v in row}, ex
        assert run_program(ex.program) == pytest.approx(ex.exe_ans)


def run_program(program: str) -> float:
    """FinQA's program DSL (``op(a, b), op(#0, c)``), executed step by step."""
    ops = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
           "divide": lambda a, b: a / b}
    results: list[float] = []
    for step in program.split("), "):
        name, _, args = step.rstrip(")").partition("(")
        a, b = (results[int(x[1:])] if x.startswith("#") else float(x) for x in args.split(", "))
        results.append(ops[name](a, b))
    return results[-1]


def test_held_out_split_has_disjoint_companies():
    train = {generate_example(s, test=False).company for s in range(1000)}
    test = {generate_example(s, test=True).company for s in range(300)}
    assert train and test and not train & test
    assert all(is_held_out(c, 0.2) for c in test) and not any(is_held_out(c, 0.2) for c in train)


def test_every_number_word_is_known():
    """Table cells and calculator results (what the oracle answers with) are words a scratch tokenizer gets."""
    words = set(number_words())
    for seed in range(2000):
        ex = generate_example(seed, test=seed % 2 == 0)
        cells = {c for row in ex.table[1:] for c in row[1:]}
        assert cells <= words
        assert calculator(ex.expression) in words and calculator(ex.flawed_expression) in words


def test_rendered_document_puts_each_value_after_its_year():
    ex = generate_example(3, test=False)
    text = render_document(ex)
    header, *rows = ex.table
    for row in rows:
        assert " , ".join(f"{row[0]} {y} {v}" for y, v in zip(header[1:], row[1:], strict=True)) in text.splitlines()


def test_jsonl_round_trip_and_cli(tmp_path):
    exs = [generate_example(s, test=False) for s in range(5)]
    write_jsonl(tmp_path / "a.jsonl", exs)
    assert read_jsonl(tmp_path / "a.jsonl") == exs
    main([str(tmp_path / "out"), "--n", "8"])
    train, test = read_jsonl(tmp_path / "out" / "train.jsonl"), read_jsonl(tmp_path / "out" / "test.jsonl")
    assert len(train) == 8 and len(test) == 2 and {e.split for e in test} == {"test"}


def test_finqa_nested_record_is_accepted():
    """FinQA's own layout: qa.question, qa.exe_ans as a fraction, qa.answer as a percentage."""
    rec = {"id": "ADI/2009/page_49.pdf-1", "pre_text": ["interest rate ..."], "post_text": [],
           "table": [["", "2009", "2008"], ["net revenue", "$ 2573", "$ 2583"]],
           "qa": {"question": "what is the percentage change in net revenue?", "answer": "-0.4%",
                  "exe_ans": -0.00387, "program": "subtract(2573, 2583), divide(#0, 2583)"}}
    ex = example_from_json(rec, "line 1")
    assert (ex.exe_ans, ex.unit, ex.question) == (pytest.approx(-0.387), "%", "what is the percentage change in net revenue?")
    assert example_from_json({"question": "q", "table": [["a"]], "exe_ans": 3}, "x").exe_ans == 3.0


@pytest.mark.parametrize(("rec", "needle"), [
    ({"table": [["a"]], "exe_ans": 1}, "'question'"),
    ({"question": "q", "exe_ans": 1}, "'table'"),
    ({"question": "q", "table": [["a"]]}, "'exe_ans'"),
    ({"question": "q", "table": [["a"]], "exe_ans": "12"}, "exe_ans must be a number"),
    ({"question": "q", "table": [["a"]], "answer": "about 12"}, "'exe_ans'"),
    ({"question": "q", "table": [["a"]], "exe_ans": 1, "pre_text": "text"}, "'pre_text'"),
])
def test_bad_records_name_the_field(rec, needle):
    with pytest.raises(SchemaError, match=needle):
        example_from_json(rec, "f.jsonl:3")


def test_bad_files(tmp_path):
    with pytest.raises(SchemaError, match="does not exist"):
        read_jsonl(tmp_path / "none.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(SchemaError, match="holds no examples"):
        read_jsonl(tmp_path / "e.jsonl")
    (tmp_path / "b.jsonl").write_text('{"question": "q"\n')
    with pytest.raises(SchemaError, match=r"b.jsonl:1: not JSON"):
        read_jsonl(tmp_path / "b.jsonl")


def test_gold_is_the_exact_value_and_answer_is_rounded():
    ex = next(e for e in (generate_example(s, test=False) for s in range(100)) if e.kind == "growth")
    body = ex.expression[len("round( "):ex.expression.rindex(",")]
    assert ex.exe_ans == pytest.approx(float(evaluate(body)))
    assert ex.answer.endswith("%") and parse_answer(ex.answer)[0] == round(ex.exe_ans, 1)
    assert json.loads(json.dumps(ex.table)) == ex.table
