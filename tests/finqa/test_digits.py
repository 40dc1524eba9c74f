"""Numbers digit by digit (``env.kwargs.spaced_digits``): the spacing and joining rule, and the env in that form."""

from __future__ import annotations

import json
import random
import re

import pytest

from arborl.finqa.data import KINDS, generate_example
from arborl.finqa.digits import NUMBER, WORDS, joined_digits, spaced_digits
from arborl.finqa.env import CALCULATOR, DigitSpaced, calculator_call, finqa_env, reward
from arborl.finqa.reward import score
from tests.finqa.test_env import diff_player

# (text, spaced, joined back): hand-written
TABLE = [
    ("53.4", "5 3 . 4", "53.4"),
    ("revenue 2020 609 , revenue 2021 595", "revenue 2 0 2 0 | 6 0 9 , revenue 2 0 2 1 | 5 9 5",
     "revenue 2020 | 609 , revenue 2021 | 595"),  # adjacent numbers: a | keeps them two
    ("-22.4", "- 2 2 . 4", "- 22.4"),  # the sign is a word of its own
    ("53-75", "5 3 - 7 5", "53 - 75"),  # an operator never joins
    ("(901-812)/812*100", "( 9 0 1 - 8 1 2 )/ 8 1 2 * 1 0 0", "( 901 - 812 )/ 812 * 100"),  # only numbers are spaced
    ("1e5", "1 e 5", "1e5"),
    ("1e-5 2E+3", "1 e - 5 | 2 E + 3", "1e-5 | 2E+3"),
    ("12.5%", "1 2 . 5 %", "12.5 %"),
    ("-$25", "-$ 2 5", "-$ 25"),
    ("2020-01-15", "2 0 2 0 - 0 1 - 1 5", "2020 - 01 - 15"),  # a date: leading zeros kept
    ("in 2020. 53 rose", "in 2 0 2 0 | . 5 3 rose", "in 2020 | . 53 rose"),  # a full stop is not a decimal point
    ("ends 53.4.", "ends 5 3 . 4 .", "ends 53.4 ."),
    ("x1 = 3rd FY2019 v1.2.3", "x1 = 3rd FY2019 v1.2.3", "x1 = 3rd FY2019 v1.2.3"),  # digits inside words stay
    ("1,250", "1 , 2 5 0", "1 , 250"),  # a comma separates: the calculator reads no thousands separators
    ("a\n12\n13 b", "a\n1 2 |\n1 3 b", "a\n12 |\n13 b"),  # line breaks stay
    ("no numbers  here", "no numbers here", "no numbers here"),
]


@pytest.mark.parametrize(("text", "spaced", "joined"), TABLE)
def test_spacing_table(text, spaced, joined):
    assert spaced_digits(text) == spaced
    assert joined_digits(spaced) == joined


YEARS = frozenset({"2020", "2021", "5"})
# (text, spaced with YEARS kept, joined back): hand-written
KEPT = [
    ("revenue 2020 609 , revenue 2021 595", "revenue 2020 6 0 9 , revenue 2021 5 9 5",
     "revenue 2020 609 , revenue 2021 595"),  # a kept word is no number: no | beside it
    ("from 2020 to 2021 ?", "from 2020 to 2021 ?", "from 2020 to 2021 ?"),
    ("609 2020 610", "6 0 9 2020 6 1 0", "609 2020 610"),
    ("in 2020. 53", "in 2020. 5 3", "in 2020. 53"),
    ("2020.5 20201 2022", "2 0 2 0 . 5 | 2 0 2 0 1 | 2 0 2 2", "2020.5 | 20201 | 2022"),  # only the whole number is kept
    ("5 7", "5 | 7", "5 | 7"),  # a one-digit word is never kept: it would join with its neighbours
]


@pytest.mark.parametrize(("text", "spaced", "joined"), KEPT)
def test_kept_words_stay_one_word(text, spaced, joined):
    assert spaced_digits(text, YEARS) == spaced
    assert joined_digits(spaced) == joined


@pytest.mark.parametrize(("written", "read"), [
    ("5 3 . 4", "53.4"), ("5 3 | 7 5", "53 | 75"), ("5 3 7 5", "5375"), ("5 3  7 5", "53  75"),
    ("round( 5 3 , 1 )", "round( 53 , 1 )"), ("5 .", "5 ."), (". 5", ". 5"), ("5 . . 3", "5 . . 3"),
    ("1 e", "1 e"), ("e 5", "e 5"), ("2 0 2 0-0 1", "202 0-0 1"),  # a digit joins only as a word of its own
])
def test_what_joins_and_what_does_not(written, read):
    """Only digits one space apart join (with ``. d`` and an exponent); two spaces, ``|`` or a glued word do not."""
    assert joined_digits(written) == read


def test_round_trip_keeps_every_number_on_random_texts():
    """For any text: the numbers read back are the numbers written; without a ``|``, only whitespace differs."""
    rng = random.Random(0)
    parts = ["1", "23", "4.5", "0.07", "1e5", "2E-3", " ", "  ", "-", "+", "*", "/", "(", ")", ",", ".", ". ", "e",
             "x", "ab", "%", "$", "\n", "round(", "|"]
    for i in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 12)))
        keep = frozenset({"23", "1"}) if i % 2 else frozenset()  # "1" is one digit: never kept
        spaced = spaced_digits(text, keep)
        back = joined_digits(spaced)
        assert NUMBER.findall(back) == NUMBER.findall(text), (text, spaced, back)
        if spaced.count("|") == text.count("|"):
            assert re.sub(r"\s", "", back) == re.sub(r"\s", "", text), (text, spaced, back)
        spaced_numbers = [n for n in NUMBER.findall(text) if n not in keep or len(n) == 1]
        assert all(" ".join(n) in spaced for n in spaced_numbers), (text, spaced)  # one character a word


def test_two_numbers_never_merge_when_read():
    """Every word of a spaced number is one character; no word holds two digits."""
    for seed in range(300):
        env = finqa_env(sandbox="none", spaced_digits=True)
        env.reset(seed=seed)
        words = env.task.question.split()
        assert not any(re.search(r"\d\d", w) for w in words)
        ex = generate_example(seed, test=False)
        for row in ex.table[1:]:
            for year, cell in zip(ex.table[0][1:], row[1:], strict=True):
                assert f"{row[0]} {' '.join(year)} | {' '.join(cell)}" in env.task.question


def test_whole_labels_keep_the_years_one_word():
    """With ``whole_labels`` a cell reads ``item year`` then its digits, the question's years one word each."""
    env = finqa_env(sandbox="none", spaced_digits=True, whole_labels=True)
    env.reset(seed=3)  # hand-checked: Diopaem Group, 2012-2013, a diff question on assets
    assert env.task.question.split("\n")[1:3] == ["revenue 2012 4 4 0 , revenue 2013 5 5 8",
                                                  "costs 2012 2 1 4 , costs 2013 2 6 1"]
    assert env.task.question.endswith("Question : By how much did assets change from 2012 to 2013 , in millions ?")
    assert env.expert_action() == calculator_call("9 6 1 - 9 8 6")
    assert set(env.vocabulary) == set(WORDS) | {str(y) for y in range(2010, 2024)}
    for seed in range(300):
        env.reset(seed=seed)
        ex = generate_example(seed, test=False)
        numbers = [w for w in env.task.question.split() if re.search(r"\d\d", w)]
        assert numbers and set(numbers) <= set(ex.table[0][1:]), numbers  # only the years are whole
        for row in ex.table[1:]:
            for year, cell in zip(ex.table[0][1:], row[1:], strict=True):
                assert f"{row[0]} {year} {' '.join(cell)}" in env.task.question


@pytest.mark.parametrize("test", [False, True])
@pytest.mark.parametrize("whole_labels", [False, True])
def test_gold_answers_score_one_in_the_spaced_form(test, whole_labels):
    """The gold, the rounded answer and the calculator's result, written digit by digit, all score 1.0."""
    env = finqa_env(sandbox="none", spaced_digits=True, heldout_from=10_000, whole_labels=whole_labels)
    calc = DigitSpaced(CALCULATOR)
    seen = set()
    for seed in range(1000):
        env.reset(seed=seed + (10_000 if test else 0))
        ex = generate_example(seed, test=test)
        seen.add(ex.kind)
        for text in (str(ex.exe_ans), ex.answer):
            assert reward(spaced_digits(text), env.task) == 1.0, (ex, spaced_digits(text))
        result = calc({"expression": spaced_digits(ex.expression)})
        assert reward(result, env.task) == 1.0 and not re.search(r"\d\d", result), (ex, result)
        assert reward(calc({"expression": spaced_digits(ex.flawed_expression)}), env.task) == 0.0
    assert seen == set(KINDS)


def test_the_unspaced_reward_is_unchanged():
    """Off by default: the task reads numbers as words and answers are read as written."""
    env = finqa_env(sandbox="none")
    env.reset(seed=0)
    ex = generate_example(0, test=False)
    assert env.task.question.split("\n")[1] == " , ".join(
        f"{ex.table[1][0]} {y} {v}" for y, v in zip(ex.table[0][1:], ex.table[1][1:], strict=True))
    assert env.vocabulary[:3] != list(WORDS)[:3] and len(env.vocabulary) > 1000


@pytest.mark.parametrize("oracle_error", [0.0, 1.0])
@pytest.mark.parametrize("whole_labels", [False, True])
def test_the_oracle_solves_every_question_in_the_spaced_form(oracle_error, whole_labels):
    env = finqa_env(sandbox="none", spaced_digits=True, oracle_error=oracle_error, whole_labels=whole_labels)
    assert set(WORDS) <= set(env.vocabulary) and len(env.vocabulary) == len(WORDS) + 14 * whole_labels
    for seed in range(200):
        env.reset(seed=seed)
        ex = generate_example(seed, test=False)
        call = env.expert_action()
        assert call == calculator_call(spaced_digits(ex.flawed_expression if oracle_error else ex.expression))
        first = env.step(call)
        assert first.info["action_valid"] and not first.terminated and "Error" not in first.obs, first.obs
        answer = env.expert_action()
        assert not re.search(r"\d\d", answer)
        last = env.step(answer)
        assert last.terminated and last.reward == (0.0 if oracle_error else 1.0), (seed, ex, answer)
        metrics = last.info["metrics"]
        assert metrics["result_right"] == 1.0 - oracle_error and metrics["answer_is_result"] == 1.0
        assert metrics["operands_right"] == 1.0 or oracle_error  # a flawed expression may use other cells


def test_step_metrics_read_the_spaced_form():
    env = finqa_env(sandbox="none", spaced_digits=True)
    ex, play = diff_player(env)
    a, b = ex.expression.split(" - ")
    right = spaced_digits(str(int(a) - int(b)))
    assert play(calculator_call(spaced_digits(ex.expression)), f"<answer> {right} </answer>") == {
        "operands_right": 1.0, "result_right": 1.0, "answer_is_result": 1.0, "right_diff": 1.0}
    # one digit of a cell left out: a different number, not the cell
    assert play(calculator_call(f"{' '.join(a[:-1])} - {' '.join(b)}"), f"<answer> {right} </answer>") == {
        "operands_right": 0.0, "result_right": 0.0, "answer_is_result": 0.0, "right_diff": 1.0}
    # two cells written with no operator between read as one number, which is no cell
    assert play(calculator_call(f"{' '.join(a)} {' '.join(b)}"), f"<answer> {right} </answer>") == {
        "operands_right": 0.0, "result_right": 0.0, "answer_is_result": 0.0, "right_diff": 1.0}
    assert env.calls[0][2] == " ".join(a + b)


def test_calculator_errors_stay_errors_and_python_reads_spaced_code():
    env = finqa_env(sandbox="bwrap", spaced_digits=True)
    env.reset(seed=0)
    res = env.step(calculator_call("5 3 | 7 5"))
    assert res.info["tool_results"][0]["error"] and res.info["tool_stats"]["calculator"]["errors"] == 1
    code = {"name": "python", "arguments": {"code": "print( round( ( 5 2 0 - 4 4 5 ) / 4 4 5 * 1 0 0 , 1 ) , - 3 )"}}
    res = env.step(f"<tool_call>{json.dumps(code)}</tool_call>")
    assert res.info["action_valid"] and res.obs == "<tool_response>\n1 6 . 9 - 3\n</tool_response>"
    env.step("<answer> 1 6 . 9 </answer>")
    assert env.lifecycle == {"created": 1, "released": 1, "release_errors": 0}


def test_a_spaced_answer_scores_like_the_number():
    assert score(joined_digits("- 2 2 . 4"), -22.4) == (1.0, True)
    assert score(joined_digits("5 3 | 7 5"), 53.0) == (0.0, False)  # two numbers: a parse failure
