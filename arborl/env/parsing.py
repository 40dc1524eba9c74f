"""Turn a model's decoded text into one of an environment's action words.

Two shapes of output are accepted, because arborl trains both tiny models that emit a bare word
and real LLMs that think first:

* the bare word: ``"Left"``, ``" left. "``, ``"**LEFT**"`` (case-insensitive; whitespace and
  punctuation around the word are ignored, inside it they are not);
* the content of the **last** ``<answer>...</answer>`` block, judged the same way:
  ``"I should go around the hole. <answer>Down</answer>"``.

Anything else (a sentence around the word, two words, an unclosed tag) is *not* an action:
:func:`extract_action` returns ``None`` and the env reports an invalid action. Being strict keeps
the reward honest: a model is never credited for an action the parser had to guess.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from functools import lru_cache

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_STRIP = string.whitespace + string.punctuation


@lru_cache(maxsize=256)
def _choice_table(choices: tuple[str, ...]) -> dict[str, str]:
    """Map the case-folded form of each choice to the canonical choice (cached: envs reuse one set)."""
    if not choices:
        raise ValueError("extract_action: `choices` is empty; pass the env's action words, e.g. ['Left', 'Right'].")
    table: dict[str, str] = {}
    for choice in choices:
        if not isinstance(choice, str) or not choice.strip(_STRIP):
            raise ValueError(
                f"extract_action: choice {choice!r} is not a non-empty word; every choice must be a str "
                "with at least one letter or digit."
            )
        key = choice.strip(_STRIP).casefold()
        if key in table and table[key] != choice:
            raise ValueError(
                f"extract_action: choices {table[key]!r} and {choice!r} are the same word ignoring case and "
                "punctuation, so text could not tell them apart; rename one."
            )
        table[key] = choice
    return table


def extract_action(text: str, choices: Sequence[str]) -> str | None:
    """Parse a model's turn into one of ``choices``.

    Args:
        text: The decoded model output for the turn.
        choices: The valid action words; the returned value is one of these, spelled as given.

    Returns:
        The canonical choice, or ``None`` when the text is not exactly one choice (after the
        rules in the module docstring).

    Raises:
        ValueError: ``choices`` is empty or has two entries equal up to case/punctuation.

    Examples:
        >>> extract_action(" right.", ["Left", "Right"])
        'Right'
        >>> extract_action("<answer>left</answer> <answer>Right</answer>", ["Left", "Right"])
        'Right'
        >>> extract_action("go right", ["Left", "Right"]) is None
        True
    """
    table = _choice_table(tuple(choices))
    if not isinstance(text, str):
        return None
    answers = _ANSWER_RE.findall(text)
    candidate = answers[-1] if answers else text
    return table.get(candidate.strip(_STRIP).casefold())


def quote_action(text: str, limit: int = 40) -> str:
    """The model's text shortened for an error message (the model may have written a page)."""
    text = " ".join(str(text).split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def invalid_message(text: str, actions: Sequence[str]) -> str:
    """The sentence an env shows after an unparseable action."""
    return (
        f"Invalid action {quote_action(text)}: reply with exactly one of {', '.join(actions)} "
        "(optionally inside <answer></answer>). Nothing moved."
    )

