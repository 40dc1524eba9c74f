"""Small programming problems: a seeded generator (synthesis and bug fixing) and the :class:`Problem` record.

A problem is a function to write from a natural-language spec (``kind = "synth"``) or a given
function with a planted bug to fix (``kind = "bugfix"``). Both carry a few **visible** tests
(shown to the model and run by its ``python`` calls) and **hidden** tests (only the judge sees
them; the reward is 1 only if all pass, see :func:`arborl.tools.python_tool.score_solution`).

Generated problems come from :data:`FAMILIES`: list, string and arithmetic transformations with
one integer or letter parameter each (``scale`` by ``k``, ``keep_above`` ``k``, ``count`` of a
letter...). Their code is written one token per word (``def scale ( xs ) : return [ x * 3 for x
in xs ]``), one line, so it survives a word-level tokenizer's whitespace normalisation and a
from-scratch policy can read and write it; it is ordinary Python for a pretrained model too.

**Held-out split**: a problem's *key* is its family and parameter (``scale:3``); a key is held
out when a hash of it falls below ``test_frac``. Train and held-out problems share families but
never a key, so a held-out problem is never a training problem with other test inputs.

Bug-fix problems plant one of the family's realistic bugs (an off-by-one comparison, a wrong
operator or a wrong bound) chosen so that at least one visible test fails; the reference
solution is the fix. The JSONL format (also for users' own problems) is in :mod:`arborl.code.data`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arborl.env.split import held_out
from arborl.tools.python_tool import TestCase

LETTERS = "abcde"
"""Letters of generated strings (a closed set, for a word-level vocabulary)."""


@dataclass(frozen=True)
class Problem:
    """One programming problem (the fields of the JSONL format, see :mod:`arborl.code.data`).

    Attributes:
        id: Unique id.
        prompt: The natural-language spec.
        entry_point: The function to write (``""`` for stdin/stdout programs).
        signature: ``def name ( args ) :`` (``""`` for programs).
        visible: Tests shown to the model and run by its ``python`` calls.
        hidden: Tests only the judge runs.
        kind: ``"synth"`` (write it) or ``"bugfix"`` (fix ``buggy_code``).
        solution: A reference solution (needed by the oracle for synthesis; optional otherwise).
        buggy_code: The given function with a planted bug (``bugfix`` only).
        split: ``"train"`` or ``"test"``.
        key: The family and parameter of a generated problem (what the held-out split is by).
    """

    id: str
    prompt: str
    entry_point: str
    signature: str
    visible: tuple[TestCase, ...]
    hidden: tuple[TestCase, ...]
    kind: str = "synth"
    solution: str = ""
    buggy_code: str = ""
    split: str = "train"
    key: str = ""


@dataclass(frozen=True)
class Family:
    """A parametrised transformation: spec, reference body and planted bugs as templates in ``{k}``.

    Attributes:
        name: The function name (and the key's prefix).
        arg: The argument name (``xs`` a list of ints, ``s`` a string, ``n`` an int).
        spec: The spec, a template in ``{k}``.
        body: The reference return expression, a template in ``{k}``.
        bugs: Plausible wrong return expressions, templates in ``{k}``.
        params: The values ``k`` takes.
    """

    name: str
    arg: str
    spec: str
    body: str
    bugs: tuple[str, ...]
    params: tuple[Any, ...]

    def code(self, body: str, k: Any) -> str:
        """The one-line function with return expression ``body`` for parameter ``k``."""
        return f"def {self.name} ( {self.arg} ) : return {body.format(k=k)}"


_INTS = tuple(range(2, 10))
FAMILIES: tuple[Family, ...] = (
    Family("scale", "xs", "Return a list of every element of xs multiplied by {k} .",
           "[ x * {k} for x in xs ]", ("[ x + {k} for x in xs ]", "[ x * {k} for x in xs [ 1 : ] ]"), _INTS),
    Family("shift", "xs", "Return a list of every element of xs plus {k} .",
           "[ x + {k} for x in xs ]", ("[ x - {k} for x in xs ]", "[ x + {k} for x in xs [ : -1 ] ]"), _INTS),
    Family("keep_above", "xs", "Return the elements of xs that are greater than {k} , in order .",
           "[ x for x in xs if x > {k} ]", ("[ x for x in xs if x >= {k} ]", "[ x for x in xs if x < {k} ]"), _INTS),
    Family("count_below", "xs", "Return how many elements of xs are less than {k} .",
           "sum ( 1 for x in xs if x < {k} )", ("sum ( 1 for x in xs if x <= {k} )", "sum ( x for x in xs if x < {k} )"),
           _INTS),
    Family("sum_multiples", "xs", "Return the sum of the elements of xs that are divisible by {k} .",
           "sum ( x for x in xs if x % {k} == 0 )", ("sum ( x for x in xs if x % {k} != 0 )",
                                                     "sum ( 1 for x in xs if x % {k} == 0 )"), _INTS),
    Family("max_plus", "xs", "Return the largest element of xs plus {k} .",
           "max ( xs ) + {k}", ("min ( xs ) + {k}", "max ( xs ) * {k}"), _INTS),
    Family("repeat", "s", "Return the string s repeated {k} times .",
           "s * {k}", ("s * ( {k} - 1 )", "s + s * {k}"), _INTS),
    Family("prefix", "s", "Return the first {k} characters of s .",
           "s [ : {k} ]", ("s [ : {k} + 1 ]", "s [ {k} : ]"), (2, 3, 4)),
    Family("count_letter", "s", "Return how many times the letter {k} occurs in s .",
           "s . count ( '{k}' )", ("s . count ( '{k}' ) + 1", "len ( s ) - s . count ( '{k}' )"), tuple(LETTERS)),
    Family("drop_letter", "s", "Return s with every letter {k} removed .",
           "s . replace ( '{k}' , '' )", ("s . replace ( '{k}' , '' , 1 )", "s . strip ( '{k}' )"), tuple(LETTERS)),
    Family("affine", "n", "Return n times {k} plus 1 .",
           "n * {k} + 1", ("n * ( {k} + 1 )", "n + {k} + 1"), _INTS),
    Family("clamp", "n", "Return n limited to the range 0 to {k} ( 0 below it , {k} above it ) .",
           "min ( max ( n , 0 ) , {k} )", ("max ( min ( n , 0 ) , {k} )", "min ( n , {k} )"), _INTS),
)
"""The generated problem families (list, string and arithmetic transformations)."""


def is_held_out(key: str, test_frac: float) -> bool:
    """Whether a problem key (``family:param``) belongs to the held-out split (stable across runs)."""
    return held_out(f"code-split-{key}", test_frac)


def _input(arg: str, rng: random.Random) -> Any:
    if arg == "xs":
        return [rng.randint(0, 20) for _ in range(rng.randint(3, 5))]
    if arg == "s":
        return "".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 7)))
    return rng.randint(-5, 20)


def _evaluate(code: str, name: str, value: Any) -> Any:
    """Run the generator's own code (trusted, never a model's) in-process for expected values."""
    scope: dict[str, Any] = {}
    exec(code, scope)  # noqa: S102 - the generator's templates, not untrusted input
    return scope[name](value)


def _case(fam: Family, i: int, value: Any, expected: Any, tag: str) -> TestCase:
    return TestCase(f"{tag}{i}", call=f"{fam.name}({value!r})", expected=expected)


def _inputs(fam: Family, rng: random.Random, n: int) -> list[Any]:
    """``n`` distinct inputs, so that the visible tests say different things."""
    seen: list[Any] = []
    for _ in range(50 * n):
        v = _input(fam.arg, rng)
        if v not in seen:
            seen.append(v)
        if len(seen) == n:
            break
    return seen


def generate_problem(seed: int, *, test: bool = False, test_frac: float = 0.2, bugfix_frac: float = 0.5,
                     n_visible: int = 2, n_hidden: int = 5) -> Problem:
    """The problem of ``seed`` in the train (``test=False``) or held-out split; deterministic.

    Args:
        seed: Any integer; equal seeds give equal problems.
        test: Draw from the held-out keys.
        test_frac: Share of keys held out (must leave both splits non-empty).
        bugfix_frac: Share of bug-fixing problems.
        n_visible: Visible tests (a bug-fix problem's first one fails on the buggy code).
        n_hidden: Hidden tests (the visible inputs are among them, plus others).
    """
    split = "test" if test else "train"
    rng = random.Random(f"code-{split}-{seed}")
    keys = [(f, k) for f in FAMILIES for k in f.params if is_held_out(f"{f.name}:{k}", test_frac) == test]
    if not keys:
        raise ValueError(f"test_frac = {test_frac} leaves the {split} split empty; use a share in (0, 1)")
    fam, k = rng.choice(keys)
    bugfix = rng.random() < bugfix_frac
    reference, bug = fam.code(fam.body, k), ""
    for _ in range(100):
        values = _inputs(fam, rng, n_visible + n_hidden)
        expected = [_evaluate(reference, fam.name, v) for v in values]
        if not bugfix:
            break
        bug = fam.code(rng.choice(fam.bugs), k)
        wrong = [_evaluate(bug, fam.name, v) != e for v, e in zip(values, expected, strict=True)]
        if any(wrong[:n_visible]) and sum(wrong) >= 2:  # the visible failure, and hidden ones the bug cannot dodge
            first = wrong.index(True)  # the failing visible test goes first, as a user would report it
            values.insert(0, values.pop(first))
            expected.insert(0, expected.pop(first))
            break
    else:
        raise RuntimeError(f"no input of {fam.name}:{k} shows a planted bug; its bug templates are wrong")
    cases = list(zip(values, expected, strict=True))
    visible = tuple(_case(fam, i, v, e, "visible") for i, (v, e) in enumerate(cases[:n_visible]))
    hidden = tuple(_case(fam, i, v, e, "hidden") for i, (v, e) in enumerate(cases))
    spec = fam.spec.format(k=k)
    prompt = (f"Fix the bug in this function . {spec}" if bugfix else spec)
    return Problem(id=f"code-{split}-{seed}", prompt=prompt, entry_point=fam.name, signature=f"def {fam.name} ( {fam.arg} ) :",
                   visible=visible, hidden=hidden, kind="bugfix" if bugfix else "synth", solution=reference,
                   buggy_code=bug if bugfix else "", split=split, key=f"{fam.name}:{k}")


def family_words() -> list[str]:
    """Every word generated problems, solutions and bugs are made of (for a word-level tokenizer)."""
    words: dict[str, None] = {}
    add: Callable[[str], None] = lambda text: words.update(dict.fromkeys(text.split()))  # noqa: E731
    for fam in FAMILIES:
        for k in fam.params:
            for text in (fam.spec, fam.body, *fam.bugs):
                add(fam.code(text, k) if text is not fam.spec else text.format(k=k))
    add("Fix the bug in this function . " + " ".join(str(i) for i in range(-5, 101)))
    return list(words)
