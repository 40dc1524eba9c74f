"""The FinQA step reward ``operands_copied``: a calculator call labelled by whether it copied what the lookups returned."""

from arborl.finqa.prm import operands_copied
from arborl.prm.explicit import resolve_dimensions
from arborl.trajectory.schema import ToolCall, Turn


def lookup(item: str, year: str, value: str) -> Turn:
    return Turn(turn_id=f"{item}{year}", tool_call=ToolCall("lookup", {"item": item, "year": year}),
                result=f"<tool_response>\n{value}\n</tool_response>")


def calc(expression: str) -> Turn:
    return Turn(turn_id="calc", tool_call=ToolCall("calculator", {"expression": expression}),
                result="<tool_response>\n0\n</tool_response>")


LOOKUPS = [lookup("costs", "2019", "1 2 9"), lookup("expenses", "2019", "3 2"), lookup("costs", "2018", "2 0 5"),
           lookup("expenses", "2018", "4 0")]


def test_a_copied_expression_is_1_and_a_miscopied_one_0_whatever_the_outcome():
    right = [*LOOKUPS, calc(" ( 1 2 9 + 3 2 ) - ( 2 0 5 + 4 0 ) ")]
    wrong = [*LOOKUPS, calc(" ( 1 2 9 + 3 2 ) - ( 2 0 5 + 6 0 ) ")]  # 60: no lookup returned it
    for label in (0.0, 1.0):
        assert operands_copied(right, 4, label) == 1.0
        assert operands_copied(wrong, 4, label) == 0.0


def test_the_templates_constants_pass_and_unspaced_numbers_read_the_same():
    share = [lookup("costs", "2019", "1 2 9"), lookup("revenue", "2019", "5 1 6"),
             calc(" round( 1 2 9 / 5 1 6 * 1 0 0 , 1 ) ")]
    assert operands_copied(share, 2, 0.0) == 1.0
    plain = [lookup("costs", "2019", "129"), lookup("revenue", "2019", "516"), calc("round( 129 / 516 , 2 )")]
    assert operands_copied(plain, 2, 0.0) == 1.0


def test_only_calculator_calls_are_labelled_and_a_call_before_any_lookup_is_0():
    turns = [*LOOKUPS, calc("1 2 9 - 2 0 5"), Turn(turn_id="answer", action_text="<answer> - 7 6 </answer>")]
    assert [operands_copied(turns, k, 1.0) for k in range(len(turns))] == [None] * 4 + [1.0, None]
    assert operands_copied([calc("1 2 9 - 2 0 5")], 0, 1.0) == 0.0  # nothing was looked up
    assert operands_copied([*LOOKUPS, calc("")], 4, 1.0) == 0.0  # no number at all


def test_it_is_named_in_rl_prm_dimensions_by_its_path():
    dims = resolve_dimensions(["progress", "arborl.finqa.prm:operands_copied"])
    assert list(dims) == ["progress", "operands_copied"] and dims["operands_copied"] is operands_copied
