"""The problem generator: determinism, a held-out split by key, and problems that are right in the real sandbox."""

from __future__ import annotations

import ast

import pytest

from arborl.code.env import choose_backend, shared_sandbox
from arborl.code.problems import FAMILIES, generate_problem, is_held_out
from arborl.tools.python_tool import score_solution


def test_same_seed_same_problem_and_seeds_differ():
    assert generate_problem(7) == generate_problem(7)
    assert generate_problem(7, test=True) == generate_problem(7, test=True)
    assert len({repr(generate_problem(s).hidden) for s in range(30)}) == 30  # every seed has its own tests


def test_held_out_keys_are_disjoint_from_training_keys():
    train = {generate_problem(s).key for s in range(400)}
    test = {generate_problem(s, test=True).key for s in range(400)}
    assert train and test and not train & test
    assert all(is_held_out(k, 0.2) for k in test) and not any(is_held_out(k, 0.2) for k in train)
    every = {f"{f.name}:{k}" for f in FAMILIES for k in f.params}
    assert train | test <= every and len(test) >= 5  # several held-out keys, not one


def test_expected_values_by_hand():
    pr = next(p for p in map(generate_problem, range(200)) if p.key.startswith("scale:"))
    k = int(pr.key.split(":")[1])
    for case in pr.hidden:
        xs = ast.literal_eval(case.call.removeprefix("scale(").removesuffix(")"))
        assert case.expected == [x * k for x in xs]
    assert [(t.call, t.expected) for t in pr.visible] == [(t.call, t.expected) for t in pr.hidden[: len(pr.visible)]]  # the visible inputs are among the hidden ones


def test_bugfix_share_and_shape():
    probs = [generate_problem(s, bugfix_frac=0.5) for s in range(200)]
    fixes = [p for p in probs if p.kind == "bugfix"]
    assert 60 <= len(fixes) <= 140
    assert all(p.buggy_code and p.buggy_code != p.solution and p.prompt.startswith("Fix the bug") for p in fixes)
    assert all(p.kind == "synth" for p in map(lambda s: generate_problem(s, bugfix_frac=0.0), range(50)))


@pytest.mark.parametrize("test", [False, True])
def test_references_pass_hidden_tests_and_bugs_fail_visible_ones_in_the_sandbox(test):
    sb = shared_sandbox(choose_backend("auto"), 5.0)
    probs = [generate_problem(s, test=test) for s in range(16)]
    assert {p.kind for p in probs} == {"synth", "bugfix"}
    for p in probs:
        judged = score_solution(sb, p.solution, list(p.hidden))
        assert judged.score == 1.0, (p.id, judged.cases)
        if p.kind == "bugfix":
            first_visible = score_solution(sb, p.buggy_code, [p.visible[0]])
            assert first_visible.score == 0.0 and first_visible.cases[0].detail.startswith("got "), p.id
            assert score_solution(sb, p.buggy_code, list(p.hidden)).passed <= len(p.hidden) - 2
