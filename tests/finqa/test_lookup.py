"""The ``lookup(item, year)`` tool and the env without the statement (``env.kwargs.lookup``, ``statement``)."""

from __future__ import annotations

import json

import pytest

from arborl.config import ConfigError
from arborl.env import check_env
from arborl.finqa.data import KINDS, TWO_STEP, Example, expression_cells, generate_example, write_jsonl
from arborl.finqa.digits import spaced_digits
from arborl.finqa.env import TableLookup, calculator_call, finqa_env, lookup_call, lookup_cell
from arborl.tools.base import ErrorResult

# hand-written: a table whose values are all different, and one that holds 100 and 1 (the constants)
TABLE = [["item", "2019", "2020"], ["revenue", "500", "640"], ["costs", "100", "1"], ["assets", "870", "901"]]
HAND = Example(id="hand-1", question="What was the percentage change in revenue from 2019 to 2020 ? Round to one decimal .",
               table=TABLE, exe_ans=28.0, unit="%", company="Hand Made", pre_text=["Hand Made , in millions of dollars :"],
               expression="round( ( 640 - 500 ) / 500 * 100 , 1 )", flawed_expression="round( ( 640 - 500 ) / 640 * 100 , 1 )",
               kind="growth")


@pytest.mark.parametrize(("item", "year", "value"), [
    ("revenue", "2019", "500"), ("revenue", "2020", "640"), ("costs", "2020", "1"), (" assets ", " 2020 ", "901"),
    ("Assets", "2019", "870"),  # the item ignores case and spaces
])
def test_lookup_returns_the_cell(item, year, value):
    assert lookup_cell(TABLE, item, year) == value
    assert not isinstance(lookup_cell(TABLE, item, year), ErrorResult)


def test_unknown_item_or_year_is_an_error_that_names_what_exists():
    out = lookup_cell(TABLE, "sales", "2020")
    assert isinstance(out, ErrorResult)
    assert out == "LookupError: no item 'sales' ; the items are revenue , costs , assets"
    out = lookup_cell(TABLE, "revenue", "2018")
    assert isinstance(out, ErrorResult) and out == "LookupError: no year '2018' ; the years are 2019 , 2020"


def test_the_tool_is_a_typed_function_of_two_strings():
    tool = TableLookup(lambda: TABLE)
    assert tool.name == "lookup"
    assert tool.parameters["properties"].keys() == {"item", "year"} and tool.parameters["required"] == ["item", "year"]
    assert all(p["type"] == "string" for p in tool.parameters["properties"].values())
    assert tool({"item": "costs", "year": "2019"}) == "100"
    assert tool({"item": "costs", "year": 2019}).startswith("ArgumentError")  # the schema is checked first


def test_expression_cells_skip_the_constants():
    assert expression_cells(HAND.expression, TABLE) == [("revenue", "2020"), ("revenue", "2019")]
    # 100 and 1 are cells here (costs): a cell where it is an operand, a constant after "*" or ","
    assert expression_cells("round( 100 / 500 * 100 , 1 )", TABLE) == [("costs", "2019"), ("revenue", "2019")]
    assert expression_cells("( 1 + 100 ) - 7", TABLE) == [("costs", "2020"), ("costs", "2019")]


def test_expression_cells_take_the_cells_the_question_names_when_values_repeat():
    table = [["item", "2019", "2020"], ["revenue", "300", "410"], ["costs", "120", "300"]]
    question = "What was the percentage change in gross profit ( revenue minus costs ) from 2019 to 2020 ?"
    gross = "round( ( ( 410 - 300 ) - ( 300 - 120 ) ) / ( 300 - 120 ) * 100 , 1 )"  # costs 2020 = revenue 2019
    assert sorted(expression_cells(gross, table, question)) == [("costs", "2019"), ("costs", "2020"),
                                                                 ("revenue", "2019"), ("revenue", "2020")]
    assert len(expression_cells(gross, table)) == 3  # without the question: one cell per value
    assert expression_cells("300 - 120", table, "costs from 2019 to 2020") == [("costs", "2020"), ("costs", "2019")]


@pytest.fixture
def hand_env(tmp_path):
    write_jsonl(tmp_path / "t.jsonl", [HAND])
    return finqa_env(sandbox="none", train_file=str(tmp_path / "t.jsonl"), test_file=str(tmp_path / "t.jsonl"),
                     lookup=True, statement=False, max_steps=6)


def test_lookup_calls_in_the_env_on_a_hand_written_table(hand_env):
    env = hand_env
    obs, _ = env.reset(seed=0)
    res = env.step(lookup_call("revenue", "2020"))
    assert res.info["action_valid"] and res.obs == "<tool_response>\n640\n</tool_response>" and not res.terminated
    res = env.step(lookup_call("sales", "2020"))  # an unknown item: an error observation, the episode goes on
    assert res.info["tool_results"][0]["error"] and res.info["tool_stats"]["lookup"] == {"calls": 1, "errors": 1, "timeouts": 0}
    assert "no item 'sales'" in res.obs and "revenue , costs , assets" in res.obs and not res.terminated
    res = env.step(lookup_call("revenue", "1999"))
    assert "no year '1999' ; the years are 2019 , 2020" in res.obs
    env.step(lookup_call("costs", "2019"))  # a cell the gold does not read
    env.step(calculator_call("round( ( 640 - 500 ) / 500 * 100 , 1 )"))
    last = env.step("<answer> 28 </answer>")
    assert last.reward == 1.0
    # 4 lookups: one gold cell (640); two errors and costs 2019 are not; 500 was never fetched
    assert last.info["metrics"] == {"operands_right": 1.0, "result_right": 1.0, "answer_is_result": 1.0,
                                    "lookups_right": 0.25, "lookups_complete": 0.0, "right_growth": 1.0}


def test_the_prompt_has_the_statement_only_when_asked(hand_env):
    obs, _ = hand_env.reset(seed=0)
    user = obs[1]["content"]
    assert user == ("Hand Made , in millions of dollars :\nitems : revenue , costs , assets\nyears : 2019 , 2020\n"
                    f"Question : {HAND.question}")
    assert "lookup" in obs[0]["content"]
    env = finqa_env(sandbox="none")  # the old layout (the function's defaults): the statement, no lookup tool
    obs, _ = env.reset(seed=0)
    ex = generate_example(0, test=False)
    assert "revenue " + ex.table[0][1] + " " + ex.table[1][1] in obs[1]["content"] and "items :" not in obs[1]["content"]
    assert "lookup" not in env.table and "lookup" not in obs[0]["content"]
    both = finqa_env(sandbox="none", lookup=True, statement=True)
    obs, _ = both.reset(seed=0)
    assert "revenue " + ex.table[0][1] + " " + ex.table[1][1] in obs[1]["content"] and "lookup" in both.table


def test_no_value_of_the_table_is_in_the_prompt_without_the_statement():
    env = finqa_env(sandbox="none", lookup=True, statement=False, spaced_digits=True, whole_labels=True, max_steps=6)
    for seed in range(100):
        obs, _ = env.reset(seed=seed)
        user = obs[1]["content"]
        ex = generate_example(seed, test=False)
        years = " , ".join(ex.table[0][1:])
        assert f"\nitems : revenue , costs , expenses , income , assets , liabilities\nyears : {years}\nQuestion :" in user
        head = user.split("\nQuestion :")[0]
        assert not any(spaced_digits(v) in head.split("years :")[0] for row in ex.table[1:] for v in row[1:] if len(v) > 1)


@pytest.mark.parametrize(("spaced", "tool_prompt"), [(True, "compact"), (False, "hermes")])
def test_the_oracle_looks_up_then_calculates_then_answers_and_scores_one(spaced, tool_prompt):
    """oracle_error 0: every question right, by one lookup per cell of the gold, one calculator call, the answer."""
    env = finqa_env(sandbox="none", lookup=True, statement=False, spaced_digits=spaced, whole_labels=spaced,
                    tool_prompt=tool_prompt, max_steps=6)
    kinds = set()
    for seed in range(300):
        env.reset(seed=seed)
        ex = generate_example(seed, test=False)
        kinds.add(ex.kind)
        names = []
        while True:
            action = env.expert_action()
            res = env.step(action)
            assert res.info["action_valid"] and not res.info.get("error"), (seed, action, res.obs)
            names.append(res.info["action"])
            if res.terminated or res.truncated:
                break
        cells = expression_cells(ex.expression, ex.table, ex.question)
        assert len(cells) == (4 if ex.kind in TWO_STEP else 2)
        assert names == ["lookup"] * len(cells) + ["calculator", "answer"] and res.reward == 1.0, (seed, ex)
        assert [(json.loads(json.dumps(a))["item"].strip(), a["year"].replace(" ", "")) for n, a, _ in env.calls
                if n == "lookup"] == cells
        m = res.info["metrics"]
        assert m["lookups_right"] == m["lookups_complete"] == m["operands_right"] == m["result_right"] == 1.0
    assert kinds == set(KINDS)


def test_the_imperfect_teacher_looks_up_its_flawed_expression_and_fails():
    env = finqa_env(sandbox="none", lookup=True, statement=False, spaced_digits=True, whole_labels=True,
                    oracle_error=1.0, max_steps=6)
    assert env.deterministic is False
    for seed in range(100):
        env.reset(seed=seed)
        ex = generate_example(seed, test=False)
        while not ((res := env.step(env.expert_action())).terminated or res.truncated):
            pass
        assert res.reward == 0.0 and res.info["metrics"]["lookups_right"] == 1.0  # flawed cells are gold cells
        looked = [n for n, _, _ in env.calls if n == "lookup"]
        assert len(looked) == len(expression_cells(ex.flawed_expression, ex.table, ex.question))


def test_check_env_passes_with_lookup():
    check_env(finqa_env(sandbox="none", lookup=True, statement=False, max_steps=6))
    check_env(finqa_env(sandbox="none", lookup=True, statement=False, spaced_digits=True, whole_labels=True,
                        max_steps=6, oracle_error=0.6))


def test_bad_lookup_kwargs_are_config_errors():
    with pytest.raises(ConfigError, match="env.kwargs.lookup = 'yes'; use true or false"):
        finqa_env(lookup="yes")
    with pytest.raises(ConfigError, match="env.kwargs.statement = 0; use true or false"):
        finqa_env(lookup=True, statement=0)
    with pytest.raises(ConfigError, match="statement = false needs lookup = true"):
        finqa_env(statement=False)


def test_a_random_action_is_a_real_call_on_the_tasks_own_cells(hand_env, tmp_path):
    import random

    from arborl.finqa.env import RANDOM_EXPRESSIONS, random_action

    env = hand_env
    rng = random.Random(0)
    header, *rows = HAND.table
    cells = {v for r in rows for v in r[1:]}
    kinds = {"lookup": 0, "calculator": 0, "answer": 0}
    for _ in range(40):
        env.reset(seed=0)
        for _ in range(env.max_steps):
            action = env.random_action(rng)
            res = env.step(action)
            assert res.info["action_valid"], action
            kind = res.info["action"]
            kinds[kind] += 1
            if kind == "lookup":  # a cell of the table, answered with its value
                args = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]
                row = next(r for r in rows if r[0] == args["item"].strip())
                assert res.obs == f"<tool_response>\n{row[header.index(args['year'].strip())]}\n</tool_response>"
            elif kind == "calculator":  # one of the forms over two cells, computed for real
                expr = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["expression"]
                a, b = [t for t in expr.split() if t[0].isdigit()][:2]
                assert {a, b} <= cells and expr.strip() in {f.format(a=a, b=b) for f in RANDOM_EXPRESSIONS}
                assert not res.info["tool_results"][0]["error"]
            else:
                assert action == f"<answer> {env.last_results[-1].strip()} </answer>" and res.terminated
            if res.terminated or res.truncated:
                break
    assert all(kinds.values()), kinds  # every kind is drawn
    data = str(tmp_path / "t.jsonl")  # hand_env's file
    without = finqa_env(sandbox="none", train_file=data, test_file=data, max_steps=4)
    without.reset(seed=0)
    assert all('"lookup"' not in random_action(without, rng) for _ in range(30))  # no lookup tool, no lookup call
