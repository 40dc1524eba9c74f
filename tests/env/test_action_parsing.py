"""extract_action: bare words and <answer> blocks, with hand-written expectations."""

import pytest

from arborl.env.parsing import extract_action, invalid_message

CHOICES = ["Left", "Down", "Right", "Up"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Left", "Left"),
        ("left", "Left"),
        ("  RIGHT.\n", "Right"),
        ("**Up**", "Up"),
        ("'Down'!", "Down"),
        ("I see a hole below me, so: <answer>Right</answer>", "Right"),
        ("<answer>Left</answer> wait, no. <answer> up </answer>", "Up"),
        ("<ANSWER>\nDown\n</ANSWER>", "Down"),
    ],
)
def test_accepted_forms(text, expected):
    assert extract_action(text, CHOICES) == expected


@pytest.mark.parametrize(
    "text",
    [
        "go left",  # a sentence around the word is not an action
        "Left Right",
        "",
        "   ",
        "<answer>Left",  # unclosed tag
        "Le-ft",
        "Leftward",
        "Left <answer>jump</answer>",  # the last answer block decides, even if a bare word is elsewhere
        "<answer></answer>",
    ],
)
def test_rejected_forms(text):
    assert extract_action(text, CHOICES) is None


def test_non_string_text_is_not_an_action():
    assert extract_action(None, CHOICES) is None  # type: ignore[arg-type]
    assert extract_action(3, ["3"]) is None  # type: ignore[arg-type]


def test_numeric_choices():
    assert extract_action("<answer>2</answer>", ["0", "1", "2"]) == "2"
    assert extract_action("2.", ["0", "1", "2"]) == "2"
    assert extract_action("12", ["0", "1", "2"]) is None


def test_bad_choices_raise_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        extract_action("Left", [])
    with pytest.raises(ValueError, match="same word ignoring case"):
        extract_action("Left", ["Left", "left!"])
    with pytest.raises(ValueError, match="non-empty word"):
        extract_action("Left", ["Left", "..."])


def test_invalid_message_quotes_and_shortens_the_text():
    msg = invalid_message("x" * 500, CHOICES)
    assert "xxx..." in msg and len(msg) < 200
    assert "Left, Down, Right, Up" in msg
