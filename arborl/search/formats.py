"""Search-R1's file formats: a corpus of passages and a QA set, both JSON Lines.

Corpus (one passage a line, the format of Search-R1's and FlashRAG's ``wiki-18.jsonl``)::

    {"id": "0", "contents": "\\"Talia Vossberg\\"\\nTalia Vossberg (born 1962) is ..."}

``contents`` is the title (in double quotes, as Search-R1 writes it) on the first line, then the
text. ``id`` may be a string or an integer; arborl keeps it as a string.

QA set (one question a line; ``question`` and ``golden_answers`` are Search-R1's fields, the rest
are arborl's and optional)::

    {"id": "q00017", "question": "...", "golden_answers": ["Ostravia"], "hops": 2,
     "supporting_ids": ["p01234", "p00042"], "oracle_queries": ["...", "..."],
     "bridge_answers": ["Kelmarsh"], "split": "test"}

The readers check every line and stop at the first bad one with a :class:`SchemaError` that
names ``file:line``, what is wrong and how to fix it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arborl.trajectory.schema import SchemaError


@dataclass(frozen=True)
class Passage:
    """One retrievable passage.

    Attributes:
        id: Unique id within the corpus (Search-R1's ``id``).
        title: The passage title, without quotes.
        text: The passage body.
    """

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's ``contents`` field: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    def to_json(self) -> dict[str, str]:
        """The corpus line as a dict: ``{"id": ..., "contents": ...}``."""
        return {"id": self.id, "contents": self.contents}

    @classmethod
    def from_contents(cls, id: str, contents: str) -> Passage:
        """Split Search-R1 ``contents`` into title (first line, quotes stripped) and text."""
        title, _, text = contents.partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
        return cls(id=id, title=title, text=text)


@dataclass(frozen=True)
class Question:
    """One QA item.

    Attributes:
        id: Unique id within the QA set.
        question: The question text shown to the model.
        golden_answers: Every accepted answer; exact match against any of them scores 1.
        hops: How many searches the question needs (the generator: 1, 2 or 3; 0 when unknown).
        supporting_ids: The passage id each hop needs, in order.
        oracle_queries: A search query per hop that retrieves that hop's passage; the query of
            hop ``i + 1`` contains ``bridge_answers[i]``, the answer found at hop ``i``.
        bridge_answers: What each hop but the last finds (e.g. the founder's name).
        split: ``"train"`` or ``"test"`` (held out); empty when the file does not say.
        extra: The line's other fields, kept as they are (the generator writes ``kind`` and
            ``subject_id``).
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    hops: int = 0
    supporting_ids: tuple[str, ...] = ()
    oracle_queries: tuple[str, ...] = ()
    bridge_answers: tuple[str, ...] = ()
    split: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The QA line as a dict (Search-R1's fields first, then arborl's)."""
        return {"id": self.id, "question": self.question, "golden_answers": list(self.golden_answers),
                "hops": self.hops, "supporting_ids": list(self.supporting_ids),
                "oracle_queries": list(self.oracle_queries), "bridge_answers": list(self.bridge_answers),
                "split": self.split, **self.extra}


def write_jsonl(path: str | Path, rows: Iterable[Passage | Question]) -> int:
    """Write passages or questions to ``path`` as JSON Lines; returns the number of lines."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def _lines(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for each non-blank line, ``where`` being ``file:line``."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            where = f"{path}:{n}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SchemaError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); "
                                  "each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise SchemaError(f"{where}: expected a JSON object, got {type(obj).__name__}; "
                                  "each line must be one JSON object") from None
            yield where, obj


def _id(where: str, obj: dict[str, Any], key: str = "id") -> str:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise SchemaError(f"{where}: {key!r} must be a non-empty string or an integer, got {value!r}")
    return str(value)


def _str_list(where: str, obj: dict[str, Any], key: str, *, required: bool) -> tuple[str, ...]:
    if key not in obj and not required:
        return ()
    value = obj.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (required and not value):
        raise SchemaError(f"{where}: {key!r} must be a {'non-empty ' if required else ''}list of strings, "
                          f'e.g. ["Paris"]; got {value!r}')
    return tuple(value)


def _unique(where: str, seen: set[str], id_: str, kind: str) -> None:
    if id_ in seen:
        raise SchemaError(f"{where}: duplicate {kind} id {id_!r}; ids must be unique within the file")
    seen.add(id_)


def read_corpus(path: str | Path) -> list[Passage]:
    """Read a Search-R1 corpus JSONL (``{"id", "contents"}`` a line).

    Raises:
        SchemaError: On the first bad line, naming ``file:line`` and the problem.
        FileNotFoundError: When ``path`` does not exist.
    """
    passages: list[Passage] = []
    seen: set[str] = set()
    for where, obj in _lines(path):
        id_ = _id(where, obj)
        contents = obj.get("contents")
        if not isinstance(contents, str) or not contents.strip():
            raise SchemaError(f"{where}: 'contents' must be a non-empty string ('\"Title\"\\ntext'), got {contents!r}")
        _unique(where, seen, id_, "passage")
        passages.append(Passage.from_contents(id_, contents))
    if not passages:
        raise SchemaError(f"{path}: the corpus has no passages; write one JSON object a line")
    return passages


def read_qa(path: str | Path) -> list[Question]:
    """Read a QA JSONL with Search-R1's ``question`` and ``golden_answers`` (plus arborl's optional fields).

    A line without ``id`` gets ``"line-N"``. Unknown fields are kept in :attr:`Question.extra`.

    Raises:
        SchemaError: On the first bad line, naming ``file:line`` and the problem.
        FileNotFoundError: When ``path`` does not exist.
    """
    known = {"id", "question", "golden_answers", "hops", "supporting_ids", "oracle_queries", "bridge_answers", "split"}
    questions: list[Question] = []
    seen: set[str] = set()
    for where, obj in _lines(path):
        id_ = _id(where, obj) if "id" in obj else f"line-{where.rpartition(':')[2]}"
        text = obj.get("question")
        if not isinstance(text, str) or not text.strip():
            raise SchemaError(f"{where}: 'question' must be a non-empty string, got {text!r}")
        golden = _str_list(where, obj, "golden_answers", required=True)
        hops = obj.get("hops", 0)
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
            raise SchemaError(f"{where}: 'hops' must be a non-negative integer, got {hops!r}")
        split = obj.get("split", "")
        if not isinstance(split, str):
            raise SchemaError(f"{where}: 'split' must be a string such as \"train\" or \"test\", got {split!r}")
        _unique(where, seen, id_, "question")
        questions.append(Question(
            id=id_, question=text, golden_answers=golden, hops=hops,
            supporting_ids=_str_list(where, obj, "supporting_ids", required=False),
            oracle_queries=_str_list(where, obj, "oracle_queries", required=False),
            bridge_answers=_str_list(where, obj, "bridge_answers", required=False),
            split=split, extra={k: v for k, v in obj.items() if k not in known}))
    if not questions:
        raise SchemaError(f"{path}: the QA file has no questions; write one JSON object a line")
    return questions
