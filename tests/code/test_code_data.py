"""The JSONL loader: arborl's format round-trips, DeepCoder / LiveCodeBench tests load, a bad line is named."""

from __future__ import annotations

import json

import pytest

from arborl.code.data import problem_from_json, read_jsonl, write_jsonl
from arborl.code.env import choose_backend, shared_sandbox
from arborl.code.problems import generate_problem
from arborl.tools.python_tool import score_solution
from arborl.trajectory.schema import SchemaError


def test_generated_problems_round_trip(tmp_path):
    probs = [generate_problem(s) for s in range(10)] + [generate_problem(s, test=True) for s in range(3)]
    write_jsonl(tmp_path / "p.jsonl", probs)
    back = read_jsonl(tmp_path / "p.jsonl")
    assert [(p.id, p.kind, p.solution, p.buggy_code, p.split, p.visible, p.hidden) for p in back] == [
        (p.id, p.kind, p.solution, p.buggy_code, p.split, p.visible, p.hidden) for p in probs]


def test_livecodebench_public_private_and_functional_tests():
    line = {"question_id": "lcb-1", "question_content": "Add two numbers.", "starter_code": "def add(a, b):",
            "metadata": json.dumps({"func_name": "add"}),
            "public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]),
            "private_test_cases": json.dumps([{"input": "[1, 2]\n[3]", "output": "[1, 2, 3]", "testtype": "functional"}])}
    pr = problem_from_json(line)
    assert pr.id == "lcb-1" and pr.entry_point == "add" and pr.signature == "def add(a, b):"
    assert [(t.call, t.expected) for t in pr.visible] == [("add(1, 2)", 3)]
    assert [(t.call, t.expected) for t in pr.hidden] == [("add(1, 2)", 3), ("add([1, 2], [3])", [1, 2, 3])]


def test_deepcoder_stdin_and_taco_function_tests_score_in_the_sandbox():
    stdin_line = {"problem": "Print the sum of two integers.", "tests": json.dumps(
        [{"input": "1 2\n", "output": "3\n"}, {"input": "5 -7\n", "output": "-2\n"}, {"input": "0 0\n", "output": "0\n"}])}
    pr = problem_from_json(stdin_line, n_visible=1)
    assert len(pr.visible) == 1 and len(pr.hidden) == 3 and pr.entry_point == ""
    sb = shared_sandbox(choose_backend("auto"), 5.0)
    right = "a, b = map(int, input().split())\nprint(a + b)"
    assert score_solution(sb, right, list(pr.hidden)).score == 1.0
    assert score_solution(sb, right.replace("a + b", "a - b"), list(pr.hidden)).passed == 1  # only 0 0 -> 0
    taco = problem_from_json({"prompt": "Double it.", "tests": {"fn_name": "double", "inputs": [[2], [5]],
                                                                 "outputs": [4, 10]}})
    assert [(t.call, t.expected) for t in taco.hidden] == [("double(2)", 4), ("double(5)", 10)]
    assert score_solution(sb, "def double(x):\n    return 2 * x", list(taco.hidden)).score == 1.0


@pytest.mark.parametrize(("line", "field"), [
    ('{"prompt": "p", "hidden_tests": [{"call": "f(1)"}]}', "hidden_tests"),
    ('{"prompt": "p", "hidden_tests": [{"call": "f(", "expected": 1}]}', "hidden_tests"),
    ('{"hidden_tests": [{"call": "f(1)", "expected": 1}]}', "prompt"),
    ('{"prompt": "p", "hidden_tests": []}', "hidden_tests"),
    ('{"prompt": "p", "kind": "bugfix", "hidden_tests": [{"call": "f(1)", "expected": 1}]}', "kind"),
    ('{"prompt": "p", "tests": [{"input": "1", "output": "2", "testtype": "functional"}]}', "tests"),
    ('{"prompt": "p", "hidden_tests": [{"call": "f(1)", "expected": 1}], "split": "dev"}', "split"),
])
def test_a_bad_line_is_named_by_line_and_field(tmp_path, line, field):
    good = json.dumps({"prompt": "p", "hidden_tests": [{"call": "f(1)", "expected": 1}]})
    path = tmp_path / "p.jsonl"
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(SchemaError, match=rf"p\.jsonl:3: .*'{field}'"):
        read_jsonl(path)


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(SchemaError, match=r"p\.jsonl:1: "):
        read_jsonl(path)
    with pytest.raises(SchemaError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_the_data_command_writes_both_splits(tmp_path):
    from arborl.code.data import main

    main([str(tmp_path), "--n", "8"])
    train, test = read_jsonl(tmp_path / "train.jsonl"), read_jsonl(tmp_path / "test.jsonl")
    assert len(train) == 8 and len(test) == 2
    assert {p.split for p in train} == {"train"} and {p.split for p in test} == {"test"}
    assert train[0].solution == generate_problem(0).solution
