"""Generated financial statements and arithmetic questions over them, FinQA-style, and their JSONL format.

One example is one company's statement (a table of line items by year, rendered as text) and one
question whose answer needs arithmetic over the table:

===============  ============================================================  =====
kind             gold program                                                   steps
===============  ============================================================  =====
``diff``         ``X[y2] - X[y1]``                                             1
``growth``       ``(X[y2] - X[y1]) / X[y1] * 100``, percent                    1
``share``        ``X[y] / revenue[y] * 100``, percent                          1
``ratio``        ``A[y] / B[y]``                                               1
``gross_growth`` growth of ``revenue - costs`` from y1 to y2, percent          2
``total_change`` ``(costs[y2] + expenses[y2]) - (costs[y1] + expenses[y1])``   2
===============  ============================================================  =====

Every number in a table is an integer from 1 to 999 (millions) and every answer is small:
integers within ±999, percentages within ±99.9 and at least 6 in size (so one decimal is within the
1e-2 tolerance), ratios from 0.6 to 4.99 (two decimals). The questions say how to round; the gold
answer (``exe_ans``) is exact. This keeps the words a from-scratch word-level policy reads and writes
to a closed set (:func:`number_words`), while the arithmetic stays the calculator's job.

**Held-out split**: a company is held out when a hash of its name falls in ``test_frac``; train and
test examples are about disjoint companies, and come from disjoint seeds.

**JSONL format** (one example a line; :func:`read_jsonl` also takes FinQA's nested ``qa``)::

    {"id": "finqa-gen-12", "company": "Vornex Holdings", "pre_text": ["..."], "post_text": [],
     "table": [["item", "2019", "2020", "2021"], ["revenue", "812", "901", "950"], ...],
     "question": "...", "answer": "11.0%", "exe_ans": 10.96, "unit": "%",
     "program": "subtract(901, 812), divide(#0, 812), multiply(#1, 100)",
     "expression": "( 901 - 812 ) / 812 * 100", "kind": "growth", "split": "train"}

``exe_ans`` (a number) is the gold; without it, ``answer`` is parsed (``"12.5%"`` sets
``unit = "%"``). ``table`` is FinQA's list of rows, first row the header. Only ``question``,
``table`` and ``exe_ans`` or ``answer`` are required; ``expression`` (the calculator expression the
oracle calls) is needed for synthetic demonstrations.

    python -m arborl.finqa.data OUT_DIR [--seed 0] [--n 2000]    # writes train.jsonl and test.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arborl.env.split import held_out
from arborl.trajectory.schema import SchemaError

ITEMS = ("revenue", "costs", "expenses", "income", "assets", "liabilities")
"""Line items of every generated statement (one word each; ``income = revenue - costs - expenses``)."""
KINDS = ("diff", "growth", "share", "ratio", "gross_growth", "total_change")
"""Question kinds, in the order of the module docstring's table."""
TWO_STEP = ("gross_growth", "total_change")
_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "k", "l", "m", "n", "p", "r", "s", "st", "t", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "io"]
_CODAS = ["", "n", "r", "x", "l", "s", "m", "th"]
_SUFFIXES = ["Holdings", "Industries", "Systems", "Group", "Works", "Labs", "Partners", "Capital"]


@dataclass(frozen=True)
class Example:
    """One statement and one question (the fields of the JSONL format)."""

    id: str
    question: str
    table: list[list[str]]
    exe_ans: float
    answer: str = ""
    unit: str = ""
    """``"%"`` when the answer is a percentage (then the fraction form is accepted too)."""
    company: str = ""
    pre_text: list[str] = field(default_factory=list)
    post_text: list[str] = field(default_factory=list)
    program: str = ""
    expression: str = ""
    kind: str = ""
    split: str = "train"
    flawed_expression: str = ""
    """A plausible wrong expression (a weaker teacher's demonstration; see ``FinQATask``)."""


YEARS = range(2010, 2024)
"""Every year a generated statement can hold (2 or 3 consecutive years from 2010-2021 on)."""


def company_name(rng: random.Random) -> str:
    """A fictional company name (two syllables and a suffix)."""
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(2))
    return f"{word.capitalize()} {rng.choice(_SUFFIXES)}"


def is_held_out(company: str, test_frac: float) -> bool:
    """Whether ``company`` belongs to the held-out split (a hash of the name, stable across runs)."""
    return held_out(company, test_frac)


def _statement(rng: random.Random, n_years: int) -> dict[str, list[int]]:
    """Line items by year, within 1..999 and consistent (income = revenue - costs - expenses)."""
    while True:
        rev = [rng.randint(300, 700)]
        for _ in range(n_years - 1):
            rev.append(round(rev[-1] * (1 + rng.uniform(-0.25, 0.4))))
        costs = [round(r * rng.uniform(0.3, 0.55)) for r in rev]
        expenses = [round(r * rng.uniform(0.1, 0.3)) for r in rev]
        income = [r - c - e for r, c, e in zip(rev, costs, expenses, strict=True)]
        assets = [rng.randint(300, 990)]
        for _ in range(n_years - 1):
            assets.append(round(assets[-1] * (1 + rng.uniform(-0.15, 0.25))))
        liabilities = [round(a * rng.uniform(0.35, 0.9)) for a in assets]
        table = dict(zip(ITEMS, (rev, costs, expenses, income, assets, liabilities), strict=True))
        if all(1 <= v <= 999 for row in table.values() for v in row):
            return table


def _question(kind: str, rng: random.Random, t: dict[str, list[int]], years: list[int]) -> tuple[str, str, str, str, str]:
    """(question, expression, flawed expression, FinQA program, unit) of one kind, for random columns."""
    i, j = sorted(rng.sample(range(len(years)), 2))
    y1, y2, y = years[i], years[j], rng.randrange(len(years))
    if kind == "diff":
        x = rng.choice(ITEMS)
        a, b = t[x][i], t[x][j]
        return (f"By how much did {x} change from {y1} to {y2} , in millions ?", f"{b} - {a}", f"{a} - {b}",
                f"subtract({b}, {a})", "")
    if kind == "growth":
        x = rng.choice(ITEMS)
        a, b = t[x][i], t[x][j]
        return (f"What was the percentage change in {x} from {y1} to {y2} ? Round to one decimal .",
                f"round( ( {b} - {a} ) / {a} * 100 , 1 )", f"round( ( {b} - {a} ) / {b} * 100 , 1 )",
                f"subtract({b}, {a}), divide(#0, {a}), multiply(#1, 100)", "%")
    if kind == "share":
        x = rng.choice(("costs", "expenses", "income"))
        a, r = t[x][y], t["revenue"][y]
        return (f"What were {x} as a percentage of revenue in {years[y]} ? Round to one decimal .",
                f"round( {a} / {r} * 100 , 1 )", f"round( {a} / ( {r} - {a} ) * 100 , 1 )",
                f"divide({a}, {r}), multiply(#0, 100)", "%")
    if kind == "ratio":
        num, den = rng.choice((("liabilities", "assets"), ("assets", "liabilities"), ("revenue", "assets")))
        a, b = t[num][y], t[den][y]
        return (f"What was the ratio of {num} to {den} in {years[y]} ? Round to two decimals .",
                f"round( {a} / {b} , 2 )", f"round( {b} / {a} , 2 )", f"divide({a}, {b})", "")
    if kind == "gross_growth":
        r1, c1, r2, c2 = t["revenue"][i], t["costs"][i], t["revenue"][j], t["costs"][j]
        return (f"What was the percentage change in gross profit ( revenue minus costs ) from {y1} to {y2} ? "
                "Round to one decimal .",
                f"round( ( ( {r2} - {c2} ) - ( {r1} - {c1} ) ) / ( {r1} - {c1} ) * 100 , 1 )",
                f"round( ( {r2} - {r1} ) / {r1} * 100 , 1 )",
                f"subtract({r1}, {c1}), subtract({r2}, {c2}), subtract(#1, #0), divide(#2, #0), multiply(#3, 100)",
                "%")
    c1, e1, c2, e2 = t["costs"][i], t["expenses"][i], t["costs"][j], t["expenses"][j]
    return (f"By how much did total costs and expenses change from {y1} to {y2} , in millions ?",
            f"( {c2} + {e2} ) - ( {c1} + {e1} )", f"{c2} - {c1}",
            f"add({c1}, {e1}), add({c2}, {e2}), subtract(#1, #0)", "")


def _exact(expression: str) -> float:
    """The unrounded value of a generated expression (``round( e , n )`` unwrapped)."""
    from arborl.tools.calculator import evaluate

    body = expression
    if body.startswith("round( "):
        body = body[len("round( "):body.rindex(",")]
    return float(evaluate(body))


def _fits(kind: str, value: float) -> bool:
    """Answers stay in the closed set of number words (see the module docstring)."""
    if kind in ("growth", "share", "gross_growth"):
        return 6 <= abs(value) <= 99.9
    if kind == "ratio":
        return 0.6 <= value <= 4.99
    return value != 0 and abs(value) <= 999


def render_answer(value: float, unit: str, kind: str) -> str:
    """The answer string as the question asks for it (rounded; ``%`` for percentages)."""
    if kind == "ratio":
        return f"{value:.2f}"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:g}"


def generate_example(seed: int, *, test: bool, test_frac: float = 0.2, kinds: tuple[str, ...] = KINDS) -> Example:
    """The example of ``seed``: a company of the requested split, a statement and one question.

    Args:
        seed: Seeds the whole example (the same seed gives the same example).
        test: Draw a held-out company (else a training one).
        test_frac: Share of company names that are held out.
        kinds: Question kinds to draw from.
    """
    rng = random.Random(f"finqa-{seed}")
    while True:
        company = company_name(rng)
        if is_held_out(company, test_frac) == test:
            break
    n_years = rng.choice((2, 3))
    start = rng.randint(YEARS[0], YEARS[-1] - 2)
    years = list(range(start, start + n_years))
    t = _statement(rng, n_years)
    while True:
        kind = rng.choice(kinds)
        question, expression, flawed, program, unit = _question(kind, rng, t, years)
        value = _exact(expression)
        if _fits(kind, value) and _fits(kind, _exact(flawed)) and abs(_exact(flawed) - value) > 0.02 * abs(value):
            break
    table = [["item", *map(str, years)], *([x, *map(str, t[x])] for x in ITEMS)]
    pre = [f"{company} , in millions of dollars :"]
    return Example(id=f"finqa-gen-{seed}", question=question, table=table, exe_ans=value,
                   answer=render_answer(value, unit, kind), unit=unit, company=company, pre_text=pre,
                   program=program, expression=expression, kind=kind, split="test" if test else "train",
                   flawed_expression=flawed)


def render_document(ex: Example) -> str:
    """The statement as the model reads it: pre-text, one line per table row, post-text.

    A row reads ``revenue 2019 812 , revenue 2020 901``: every value right after its item and
    year, every number a separate word (a lookup is then a match on the two words before it).
    """
    header, *rows = ex.table
    lines = [*ex.pre_text]
    for row in rows:
        label, *cells = row
        lines.append(" , ".join(f"{label} {y} {v}" for y, v in zip(header[1:], cells, strict=False)))
    lines += ex.post_text
    return "\n".join(lines)


def render_index(ex: Example) -> str:
    """The prompt without the statement (``env.kwargs.statement = false``): what the ``lookup`` tool can fetch.

    The pre-text (the company line), the table's items and its years, the post-text; no value::

        Vornex Holdings , in millions of dollars :
        items : revenue , costs , expenses , income , assets , liabilities
        years : 2019 , 2020 , 2021
    """
    header, *rows = ex.table
    return "\n".join([*ex.pre_text, "items : " + " , ".join(r[0] for r in rows),
                      "years : " + " , ".join(header[1:]), *ex.post_text])


def expression_cells(expression: str, table: list[list[str]], question: str = "") -> list[tuple[str, str]]:
    """The table cells ``(item, year)`` an expression reads, in the order it first reads them.

    A number of the expression is a cell when some cell holds it, unless it is a constant: the
    digits argument of ``round( ... , n )`` (a number after a comma) or the ``100`` of ``* 100``.
    When several cells hold the number, the first (in row order) whose item and year both are
    words of ``question`` and that is not listed yet is taken; a number that only such listed
    cells hold is a repeat. Without such a cell, the first cell holding it, once.

    >>> t = [["item", "2019", "2020"], ["revenue", "500", "600"], ["costs", "100", "250"]]
    >>> expression_cells("round( ( 600 - 500 ) / 500 * 100 , 1 )", t)
    [('revenue', '2020'), ('revenue', '2019')]
    >>> expression_cells("round( 100 / 600 * 100 , 1 )", t)
    [('costs', '2019'), ('revenue', '2020')]
    """
    header, *rows = table
    holders: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        for year, value in zip(header[1:], row[1:], strict=False):
            holders.setdefault(value.strip(), []).append((row[0], year))
    asked = set(question.replace("?", " ").split())
    words = expression.replace("(", " ( ").replace(")", " ) ").replace(",", " , ").split()
    out: list[tuple[str, str]] = []
    for k, w in enumerate(words):
        before = words[k - 1] if k else ""
        if before == "," or (before == "*" and w == "100") or w not in holders:
            continue
        named = [c for c in holders[w] if c[0] in asked and c[1] in asked]
        fresh = [c for c in named or holders[w][:1] if c not in out]
        if fresh:
            out.append(fresh[0])
    return out


@functools.lru_cache(maxsize=1)
def number_words() -> tuple[str, ...]:
    """Every number a generated table or calculator result can hold, as the calculator prints it (4,142 words)."""
    from arborl.tools.calculator import format_number

    words = {str(v) for v in range(-999, 1000)}  # cells, differences
    words |= {format_number(round(v / 10, 1)) for v in range(-999, 1000) if abs(v) >= 55}  # percentages
    words |= {format_number(round(v / 100, 2)) for v in range(55, 500)}  # ratios
    return tuple(sorted(words))


# --- files -------------------------------------------------------------------------------------
def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(f"{where}: exe_ans must be a number, got {value!r}")
    return float(value)


def example_from_json(obj: dict[str, Any], where: str) -> Example:
    """One JSONL record as an :class:`Example` (FinQA's nested ``qa`` accepted).

    Raises:
        SchemaError: A required field is missing or has the wrong type; the message names it.
    """
    from arborl.finqa.reward import parse_answer

    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
    qa = obj.get("qa") if isinstance(obj.get("qa"), dict) else {}
    merged = {**qa, **{k: v for k, v in obj.items() if k != "qa"}}
    question, table = merged.get("question"), merged.get("table")
    if not isinstance(question, str) or not question.strip():
        raise SchemaError(f"{where}: 'question' (a non-empty string) is missing")
    if not (isinstance(table, list) and table and all(isinstance(r, list) for r in table)):
        raise SchemaError(f"{where}: 'table' must be a list of rows (lists of cells), first row the header")
    answer = str(merged.get("answer", ""))
    parsed = parse_answer(answer) if answer else None
    unit = merged.get("unit", "%" if parsed is not None and parsed[1] else "")
    if "exe_ans" in merged:
        gold = _number(merged["exe_ans"], where)
        if unit == "%" and parsed is not None and abs(gold * 100 - parsed[0]) < abs(gold - parsed[0]):
            gold *= 100  # FinQA's exe_ans of "12.5%" is the fraction 0.125; the gold is the percentage
    elif parsed is not None:
        gold = parsed[0]
    else:
        raise SchemaError(f"{where}: give 'exe_ans' (a number) or a numeric 'answer'; got answer {answer!r}")
    texts = {k: merged.get(k, []) for k in ("pre_text", "post_text")}
    for k, v in texts.items():
        if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
            raise SchemaError(f"{where}: '{k}' must be a list of strings")
    return Example(id=str(merged.get("id", where)), question=question, table=[[str(c) for c in r] for r in table],
                   exe_ans=gold, answer=answer, unit=str(unit), company=str(merged.get("company", "")),
                   program=str(merged.get("program", "")), expression=str(merged.get("expression", "")),
                   kind=str(merged.get("kind", "")), split=str(merged.get("split", "train")),
                   flawed_expression=str(merged.get("flawed_expression", "")), **texts)


def read_jsonl(path: str | Path) -> list[Example]:
    """Examples from a JSONL file (see the module docstring for the fields).

    Raises:
        SchemaError: The file is missing or empty, or a line is not a valid example (named by line).
    """
    p = Path(path)
    if not p.is_file():
        raise SchemaError(f"FinQA data file {str(p)!r} does not exist; write one with `python -m arborl.finqa.data OUT_DIR`")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise SchemaError(f"{p}:{n}: not JSON ({exc})") from None
            out.append(example_from_json(obj, f"{p}:{n}"))
    if not out:
        raise SchemaError(f"FinQA data file {str(p)!r} holds no examples")
    return out


def write_jsonl(path: str | Path, examples: list[Example]) -> None:
    """Write examples one JSON object a line."""
    Path(path).write_text("".join(json.dumps(asdict(e)) + "\n" for e in examples))


def main(argv: list[str] | None = None) -> None:
    """``python -m arborl.finqa.data OUT_DIR``: write ``train.jsonl`` and ``test.jsonl``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=2000, help="training examples (and a quarter as many held out)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", [generate_example(args.seed * 10**7 + k, test=False) for k in range(args.n)])
    write_jsonl(out / "test.jsonl", [generate_example(args.seed * 10**7 + k, test=True) for k in range(args.n // 4)])


if __name__ == "__main__":
    main()
