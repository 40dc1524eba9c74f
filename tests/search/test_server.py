"""The /retrieve service over real HTTP: Search-R1's request and answer shapes, 422s, shutdown, the client."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from arborl.search.client import SearchClient, SearchError
from arborl.search.formats import Passage
from arborl.search.oracle import oracle_recall
from arborl.search.retriever import BM25Retriever
from arborl.search.server import RetrieverServer
from tests.search.conftest import free_port


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def server(bm25):
    with RetrieverServer(bm25) as s:
        yield s


def test_batch_query_with_scores_ranks_the_supporting_passage(server, world):
    queries = [q.oracle_queries[0] for q in world[1][:64]]
    status, answer = post(server.url, {"queries": queries, "topk": 3, "return_scores": True})
    assert status == 200 and list(answer) == ["result"] and len(answer["result"]) == 64
    for row in answer["result"]:
        assert len(row) == 3
        for item in row:
            assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
            assert item["document"]["contents"].startswith('"') and '"\n' in item["document"]["contents"]
        assert [i["score"] for i in row] == sorted((i["score"] for i in row), reverse=True)
    top3, n = oracle_recall(world[1][:500], SearchClient(server.url).search, topk=3, batch_size=64)
    assert n > 700 and top3 >= 0.95


def test_bare_documents_without_scores_and_default_topk(server, world, by_id):
    q = world[1][0]
    for body in ({"queries": [q.oracle_queries[0]]}, {"queries": [q.oracle_queries[0]], "topk": None, "return_scores": False}):
        status, answer = post(server.url, body)
        assert status == 200
        (row,) = answer["result"]
        assert len(row) == 3 and all(set(d) == {"id", "contents"} for d in row)  # the server's default topk
        assert row[0] == by_id[q.supporting_ids[0]].to_json()
    status, answer = post(server.url, {"queries": [], "topk": 3})
    assert status == 200 and answer == {"result": []}


def test_search_r1_request_body_and_passage_text(server, world):
    """The body Search-R1's generation.py sends, read back the way its _passages2string reads it."""
    q = world[1][1]
    payload = {"queries": [q.oracle_queries[0], q.question], "topk": 3, "return_scores": True, "extra_key": "ignored"}
    status, answer = post(server.url, payload)
    assert status == 200
    expected = []
    for result in answer["result"]:
        text = ""
        for idx, doc_item in enumerate(result):
            content = doc_item["document"]["contents"]
            title, body = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            text += f"Doc {idx + 1}(Title: {title}) {body}\n"
        expected.append(text)
    client = SearchClient(server.url, topk=3)
    assert [client(q.oracle_queries[0]), client(q.question)] == expected
    first = client.search([q.oracle_queries[0]])[0][0]
    assert first.passage.id == q.supporting_ids[0] and expected[0].startswith(f'Doc 1(Title: "{first.passage.title}") ')


BAD = [
    ({}, "queries", "missing"),
    ({"queries": "who?"}, "queries", "list_type"),
    ({"queries": ["ok", 7]}, "queries.1", "string_type"),
    ({"queries": ["a"], "topk": "3"}, "topk", "int_type"),
    ({"queries": ["a"], "topk": 0}, "topk", "greater_than_equal"),
    ({"queries": ["a"], "topk": 2.5}, "topk", "int_type"),
    ({"queries": ["a"], "return_scores": "yes"}, "return_scores", "bool_type"),
]


@pytest.mark.parametrize(("body", "field", "kind"), BAD)
def test_bad_fields_get_422_naming_the_field(server, body, field, kind):
    status, answer = post(server.url, body)
    assert status == 422
    (err,) = answer["detail"]
    assert ".".join(map(str, err["loc"])) == f"body.{field}" and err["type"] == kind
    assert answer["error"].startswith(f"body.{field}: ")


def test_body_that_is_not_json_gets_422(server):
    status, answer = post(server.url, b"queries=who")
    assert status == 422 and answer["error"].startswith("body")


def refused(url: str) -> bool:
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


@pytest.mark.parametrize("exc", [None, RuntimeError, KeyboardInterrupt])
def test_server_always_shuts_down(exc):
    r = BM25Retriever([Passage("a", "Kiwi", "kiwi apple")])
    server = RetrieverServer(r)
    with pytest.raises(exc) if exc else contextlib.nullcontext():  # noqa: SIM117
        with server:
            url, thread = server.url, server._thread
            assert post(url, {"queries": ["kiwi"], "topk": 1})[0] == 200
            if exc:
                raise exc()
    assert refused(url)
    assert not thread.is_alive()


def test_client_gives_up_on_a_dead_server_after_its_retries():
    client = SearchClient(f"http://127.0.0.1:{free_port()}/retrieve", retries=2, backoff=0.01)
    with pytest.raises(SearchError, match="after 3 attempts.*ConnectionRefused|after 3 attempts.*refused"):
        client("kiwi")
    assert client.calls == 3


def test_client_times_out_on_a_silent_server():
    with socket.socket() as silent:  # listens (connect succeeds) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = SearchClient(f"http://127.0.0.1:{silent.getsockname()[1]}/retrieve", timeout=0.3, retries=1, backoff=0.01)
        t = time.monotonic()
        with pytest.raises(SearchError, match="timeout 0.3 s"):
            client("kiwi")
        assert 0.6 <= time.monotonic() - t < 3 and client.calls == 2


def test_client_retries_5xx_but_not_4xx(server):
    failures = [2]

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            ok = failures[0] == 0
            failures[0] = max(0, failures[0] - 1)
            body = json.dumps({"result": [[{"document": {"id": 1, "contents": '"T"\nbody'}, "score": 2.0}]]} if ok
                              else {"detail": "busy"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = SearchClient(f"http://127.0.0.1:{httpd.server_address[1]}/retrieve", retries=2, backoff=0.01)
        assert client("x") == 'Doc 1(Title: "T") body\n' and client.calls == 3
    finally:
        httpd.shutdown()
        httpd.server_close()
    strict = SearchClient(server.url, retries=3)
    with pytest.raises(SearchError, match="HTTP 422.*topk"):
        strict.search(["kiwi"], topk=-1)
    assert strict.calls == 1


def test_health(server, world):
    with urllib.request.urlopen(server.url.replace("/retrieve", "/health"), timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok", "passages": len(world[0]), "method": "bm25"}


def test_concurrent_clients_each_get_their_own_answers(server, world):
    """8 threads at once, each with its own queries: no answer is mixed up or lost."""
    from concurrent.futures import ThreadPoolExecutor

    questions = world[1][:80]

    def ask(chunk: list) -> list[bool]:
        client = SearchClient(server.url, topk=3)
        return [client.search([q.oracle_queries[0]])[0][0].passage.id == q.supporting_ids[0] for q in chunk]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, [questions[i::8] for i in range(8)]))
    assert sum(map(len, results)) == 80 and all(all(r) for r in results)
