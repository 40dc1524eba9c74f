"""Reading Search-R1 corpus and QA files: round trip, a user's own files, errors that name file:line."""

from __future__ import annotations

import json

import pytest

from arborl.search.formats import Passage, read_corpus, read_qa, write_jsonl
from arborl.trajectory.schema import SchemaError


def test_generated_files_round_trip(tmp_path, world):
    passages, questions = world
    write_jsonl(tmp_path / "c.jsonl", passages)
    write_jsonl(tmp_path / "q.jsonl", questions)
    assert read_corpus(tmp_path / "c.jsonl") == passages
    back = read_qa(tmp_path / "q.jsonl")
    assert back == questions and [q.extra for q in back] == [q.extra for q in questions]
    first = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])
    assert set(first) == {"id", "contents"} and first["contents"].startswith(f'"{passages[0].title}"\n')


def test_a_users_own_files_in_search_r1_shape(tmp_path):
    (tmp_path / "c.jsonl").write_text(
        '{"id": 0, "contents": "\\"Aaron\\"\\nAaron is a prophet."}\n\n'
        '{"id": "1", "contents": "No title line here"}\n')
    (tmp_path / "q.jsonl").write_text('{"question": "who is aaron?", "golden_answers": ["a prophet"], "source": "nq"}\n')
    a, b = read_corpus(tmp_path / "c.jsonl")
    assert (a.id, a.title, a.text, a.contents) == ("0", "Aaron", "Aaron is a prophet.", '"Aaron"\nAaron is a prophet.')
    assert (b.id, b.title, b.text) == ("1", "No title line here", "")
    (q,) = read_qa(tmp_path / "q.jsonl")
    assert (q.id, q.golden_answers, q.hops, q.oracle_queries, q.split) == ("line-1", ("a prophet",), 0, (), "")
    assert q.extra == {"source": "nq"}


GOOD_C = '{"id": "a", "contents": "\\"T\\"\\ntext"}'
CORPUS_ERRORS = [
    ('{"id": "a", "contents": ', ":2: not valid JSON"),
    ('["a", "b"]', ":2: expected a JSON object, got list"),
    ('{"contents": "x"}', ":2: 'id' must be a non-empty string or an integer, got None"),
    ('{"id": true, "contents": "x"}', ":2: 'id' must be"),
    ('{"id": "b"}', ":2: 'contents' must be a non-empty string"),
    ('{"id": "b", "contents": 5}', ":2: 'contents' must be a non-empty string"),
    ('{"id": "b", "contents": "  "}', ":2: 'contents' must be a non-empty string"),
    (GOOD_C, ":2: duplicate passage id 'a'"),
]


GOOD_Q = '{"id": "q1", "question": "Q?", "golden_answers": ["A"]}'
QA_ERRORS = [
    ('{"id": "q2", "golden_answers": ["A"]}', ":2: 'question' must be a non-empty string"),
    ('{"id": "q2", "question": "Q?"}', ":2: 'golden_answers' must be a non-empty list of strings"),
    ('{"id": "q2", "question": "Q?", "golden_answers": "A"}', ":2: 'golden_answers' must be a non-empty list"),
    ('{"id": "q2", "question": "Q?", "golden_answers": []}', ":2: 'golden_answers' must be a non-empty list"),
    ('{"id": "q2", "question": "Q?", "golden_answers": ["A", 3]}', ":2: 'golden_answers' must be"),
    ('{"id": "q2", "question": "Q?", "golden_answers": ["A"], "hops": "2"}', ":2: 'hops' must be a non-negative integer"),
    ('{"id": "q2", "question": "Q?", "golden_answers": ["A"], "oracle_queries": "x"}', ":2: 'oracle_queries' must be a list"),
    ('{"id": "q2", "question": "Q?", "golden_answers": ["A"], "split": 1}', ":2: 'split' must be a string"),
    (GOOD_Q, ":2: duplicate question id 'q1'"),
]


ERRORS = [(read_corpus, GOOD_C, *e) for e in CORPUS_ERRORS] + [(read_qa, GOOD_Q, *e) for e in QA_ERRORS]


@pytest.mark.parametrize(("reader", "good", "line", "message"), ERRORS)
def test_bad_lines_name_file_line_and_problem(tmp_path, reader, good, line, message):
    path = tmp_path / "data.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(SchemaError) as e:
        reader(path)
    assert str(e.value).startswith(f"{path}{message}")
    assert "\n" not in str(e.value)


def test_empty_files_and_missing_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(SchemaError, match="no passages"):
        read_corpus(tmp_path / "e.jsonl")
    with pytest.raises(SchemaError, match="no questions"):
        read_qa(tmp_path / "e.jsonl")
    with pytest.raises(FileNotFoundError):
        read_corpus(tmp_path / "absent.jsonl")


def test_passage_contents_split():
    assert Passage.from_contents("x", '"A title"\nline one\nline two') == Passage("x", "A title", "line one\nline two")
