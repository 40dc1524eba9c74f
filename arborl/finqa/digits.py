"""Numbers written digit by digit, for word-level tokenizers: ``53.4`` <-> ``5 3 . 4``.

A word-level tokenizer makes every number one word, so copying a table cell or a result means
copying a rare word. Real models' tokenizers (Qwen2.5, Llama 3) split digits; :func:`spaced_digits`
does the same for a whitespace tokenizer, and :func:`joined_digits` reads such numbers back.

**Spacing** (what the model reads, :func:`spaced_digits`): a *number* is a run of digits with an
optional fraction (``.`` and digits) and exponent (``e``/``E``, an optional sign, digits), not
inside a word (``x1``, ``3rd``, ``FY2019`` stay as they are). Each character of a number becomes
a word of its own (``1e-5`` -> ``1 e - 5``); a sign before it is not part of it, so ``-22.4`` reads
``- 2 2 . 4``. Where two numbers would read as one (nothing but whitespace, a ``.`` or an exponent
letter between them, as in ``2020 609`` or ``in 2020. 53``), the word ``|`` goes between them:
``2 0 2 0 | 6 0 9``. Runs of spaces become one space; line breaks stay.

**Kept words** (``keep``, e.g. a table's column labels ``2019``, ``2020``): a number of two or more
characters that is one of them stays one word and counts as a word, not a number (no ``|`` next to
it): ``revenue 2020 609`` reads ``revenue 2020 6 0 9``, so a cell's key (its row label and year) is
two words while its value is still a digit copy. Joining reads only digits that stand alone, so a
kept word is never joined with the digits after it.

**Joining** (what the model writes, :func:`joined_digits`): digits separated by single spaces are
one number, with ``. d`` after a digit as its fraction and ``e``/``E`` (an optional ``+``/``-``)
and digits as its exponent: ``5 3 . 4`` -> ``53.4``, ``1 e - 5`` -> ``1e-5``. Nothing else joins: an
operator, a bracket, a comma or ``|`` keeps numbers apart (``5 3 - 7 5`` -> ``53 - 75``,
``- 2 2`` -> ``- 22``, a negative number the calculator and the answer parser both read).

Hence, for every text: the numbers of ``joined_digits(spaced_digits(text))`` are the numbers of
``text``, and when no two numbers needed a ``|``, the two texts differ only in whitespace.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.]*\w)")
"""A number as :func:`spaced_digits` spaces it (not inside a word; ``53.4.`` ends a sentence)."""
SEPARATOR = "|"
"""The word between two numbers that would otherwise read as one."""
_SPACED = re.compile(r"(?<!\S)\d(?: \d)*(?: \. \d(?: \d)*)?(?: [eE](?: [+-])? \d(?: \d)*)?(?!\S)")
_GLUE = {(), (".",), ("e",), ("E",), ("e", "+"), ("e", "-"), ("E", "+"), ("E", "-")}
"""Gaps between two numbers across which :data:`_SPACED` would read one number."""
WORDS = (*"0123456789", ".", "-", "+", "e", "E", SEPARATOR)
"""Every word a spaced number can hold (for a scratch tokenizer's vocabulary)."""


def spaced_digits(text: str, keep: frozenset[str] = frozenset()) -> str:
    """``text`` with every number written one character a word (rules in the module docstring).

    Args:
        text: Any text.
        keep: Numbers that stay one word (only those of two or more characters; a one-digit word
            would join with the digits beside it).

    >>> spaced_digits("revenue 2020 609 , growth -22.4% (1e5)")
    'revenue 2 0 2 0 | 6 0 9 , growth - 2 2 . 4 % ( 1 e 5 )'
    >>> spaced_digits("revenue 2020 609 , from 2020 to 2021", keep=frozenset({"2020", "2021"}))
    'revenue 2020 6 0 9 , from 2020 to 2021'
    """
    out: list[str] = []
    end = None
    for m in NUMBER.finditer(text):
        if len(m.group()) > 1 and m.group() in keep:
            continue
        gap = text[0 if end is None else end:m.start()]
        if end is not None and tuple(gap.split()) in _GLUE:
            gap = f" {SEPARATOR} {gap}"
        out += [gap, " " + " ".join(m.group()) + " "]
        end = m.end()
    out.append(text[end or 0:] if out else text)
    return re.sub(r" *\n *", "\n", re.sub(r" +", " ", "".join(out))).strip(" ")


def joined_digits(text: str) -> str:
    """``text`` with every spaced number written as one word again (``5 3 . 4`` -> ``53.4``).

    >>> joined_digits('{"expression": " round( ( 7 2 4 - 5 9 2 ) / 5 9 2 * 1 0 0 , 1 ) "}')
    '{"expression": " round( ( 724 - 592 ) / 592 * 100 , 1 ) "}'
    """
    return _SPACED.sub(lambda m: m.group().replace(" ", ""), text)
