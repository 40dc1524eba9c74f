"""Exact match and F1 after the standard normalisation; every generated gold answer scores 1.0."""

from __future__ import annotations

import pytest

from arborl.search.formats import Question
from arborl.search.reward import exact_match, extract_answer, f1_score, normalize_answer, validate_gold
from arborl.trajectory.schema import SchemaError

NORMALISATION = [
    ("Paris", "paris"),
    ("  The  Eiffel   Tower ", "eiffel tower"),
    ("an apple a day", "apple day"),
    ("A.B.C.", "abc"),
    ("Theodore", "theodore"),  # 'the' only as a whole word
    ("Anna and the king", "anna and king"),
    ("rock-'n'-roll!", "rocknroll"),
    ("1,962", "1962"),
    ("THE\tEND\n", "end"),
    ("the", ""),
    ("Café déjà", "café déjà"),  # non-ASCII letters are kept
]


@pytest.mark.parametrize(("raw", "normal"), NORMALISATION)
def test_normalisation_table(raw, normal):
    assert normalize_answer(raw) == normal


def test_exact_match():
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("Ostravia", ["Kelmarsh", "ostravia"]) == 1.0
    assert exact_match(None, ["x"]) == 0.0


def test_f1_by_hand():
    # pred tokens {talia, vossberg, engineer}, gold {talia, vossberg}: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Talia Vossberg, engineer", ["Talia Vossberg"]) == pytest.approx(0.8)
    # best over golds: 0 with the first, 1 with the second
    assert f1_score("Kelmarsh", ["Ostravia", "the Kelmarsh"]) == 1.0
    assert f1_score("a b", ["c d"]) == 0.0
    # repeated tokens count once each side: pred [x, x, y] vs gold [x, y]: common 2, P = 2/3, R = 1
    assert f1_score("x x y", ["x y"]) == pytest.approx(0.8)
    assert f1_score(None, ["x"]) == 0.0 and f1_score("the", ["the"]) == 0.0


def test_extract_answer_takes_the_last_tag():
    assert extract_answer("<think>..</think><answer> 1962 </answer>") == "1962"
    assert extract_answer("<answer>x</answer> then <answer>Kelmarsh\n</answer>") == "Kelmarsh"
    assert extract_answer("<answer>unterminated") is None
    assert extract_answer("no tags") is None


def test_every_generated_gold_answer_scores_one(world):
    validate_gold(world[1])
    for q in world[1]:
        assert exact_match(q.golden_answers[0], q.golden_answers) == 1.0
        assert f1_score(q.golden_answers[0], q.golden_answers) == 1.0


@pytest.mark.parametrize("gold", ["The", "!!", " "])
def test_validate_gold_rejects_answers_that_cannot_score(gold):
    with pytest.raises(SchemaError, match="q9"):
        validate_gold([Question(id="q9", question="?", golden_answers=(gold,))])
