"""Answer scoring for search QA: exact match and token F1 after the standard normalisation.

The normalisation is the one of the SQuAD evaluation script that Search-R1 and FlashRAG use:
lower-case, drop ASCII punctuation, drop the articles a/an/the as whole words, collapse
whitespace. Exact match is 1.0 when the normalised prediction equals any normalised gold
answer; F1 is the best token-overlap F1 over the gold answers.

Departure from Search-R1's ``extract_solution``: it skips the first ``<answer>`` because its
input includes the prompt's format example; :func:`extract_answer` takes the model's response
only and returns the last ``<answer>...</answer>``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from arborl.search.formats import Question
from arborl.trajectory.schema import SchemaError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation, strip articles (a, an, the), collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """1.0 when the normalised ``prediction`` equals a normalised gold answer, else 0.0 (also for ``None``)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golden_answers))


def f1_score(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """The best token F1 between the normalised ``prediction`` and any gold answer (0.0 for ``None``)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers:
        ref = normalize_answer(gold).split()
        common = sum((Counter(pred) & Counter(ref)).values())
        if common:
            precision, recall = common / len(pred), common / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def extract_answer(response: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` in ``response`` (stripped), or ``None``."""
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else None


def validate_gold(questions: Sequence[Question]) -> None:
    """Check that every gold answer scores 1.0 exact match and 1.0 F1 against its own question.

    Raises:
        SchemaError: Naming the first question whose gold answer cannot score (e.g. an answer
            that normalises to nothing, such as ``"The"`` or ``"!"``).
    """
    for q in questions:
        for gold in q.golden_answers:
            if exact_match(gold, q.golden_answers) != 1.0 or f1_score(gold, q.golden_answers) != 1.0:
                raise SchemaError(f"question {q.id!r}: gold answer {gold!r} normalises to "
                                  f"{normalize_answer(gold)!r} and cannot score 1.0; give an answer with a word in it")
