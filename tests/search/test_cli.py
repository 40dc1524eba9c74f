"""``arborl serve-retriever`` through the real CLI: start, answer over HTTP, stop on SIGTERM; bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from arborl.search.corpus import write_dataset
from tests.e2e.clikit import ctrl_c_reaches_it
from tests.search.conftest import SMALL, free_port


def arborl(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "arborl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=ctrl_c_reaches_it, **kw)


@pytest.mark.parametrize(("method", "sig", "code", "last"), [
    ("bm25", signal.SIGTERM, 0, "arborl: retriever stopped"),
    ("bm25", signal.SIGINT, 130, "arborl: stopped (Ctrl-C)"),
    ("dense", signal.SIGTERM, 0, "arborl: retriever stopped")])
def test_serve_retriever_starts_answers_and_stops(tmp_path, method, sig, code, last):
    corpus, qa = write_dataset(tmp_path, SMALL)
    q = json.loads(qa.read_text().splitlines()[0])
    port = free_port()
    proc = arborl("serve-retriever", str(corpus), "--port", str(port), "--topk", "2", "--method", method,
                  "--cache-dir", str(tmp_path / "cache"))
    try:
        line = proc.stdout.readline()
        url = f"http://127.0.0.1:{port}/retrieve"
        assert line.strip() == f"arborl: serving 246 passages ({method}) at {url}"
        body = {"queries": [q["oracle_queries"][0], "nothing"], "return_scores": True}
        for _ in range(100):  # uvicorn accepts a moment after the line
            try:
                req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
                answer = json.loads(urllib.request.urlopen(req, timeout=5).read())
                break
            except OSError:
                time.sleep(0.1)
        assert [len(r) for r in answer["result"]] == [2, 2]  # --topk is the default
        assert answer["result"][0][0]["document"]["id"] == q["supporting_ids"][0]
    finally:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)  # shutdown is prompt; a loaded machine (the suite on every core) is not
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == last
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the port is released
    assert len(list((tmp_path / "cache").glob("dense-*.npy"))) == (method == "dense")


def test_bad_corpus_line_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "a", "contents": "\\"T\\"\\nx"}\n{"id": "b"}\n')
    proc = arborl("serve-retriever", str(bad), "--port", str(free_port()))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip() == f"arborl: error: {bad}:2: 'contents' must be a non-empty string ('\"Title\"\\ntext'), got None"
    proc = arborl("serve-retriever", str(tmp_path / "absent.jsonl"))
    assert proc.communicate(timeout=60)[1].startswith("arborl: error: [Errno 2]") and proc.returncode == 2


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    corpus, _ = write_dataset(tmp_path, SMALL)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = arborl("serve-retriever", str(corpus), "--port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip() == (f"arborl: error: retriever: cannot listen on 127.0.0.1:{port} (Address already in use); "
                           "choose another --port (0 picks a free one) or --host")


def test_help_lists_the_command_and_imports_nothing_heavy():
    code = ("import sys; from arborl.cli import build_parser; h = build_parser().format_help(); "
            "print('serve-retriever' in h, sorted(m for m in ('fastapi', 'uvicorn', 'bm25s', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"
    help_ = subprocess.run([sys.executable, "-m", "arborl.cli", "serve-retriever", "--help"], capture_output=True, text=True)
    assert "--method {bm25,dense}" in help_.stdout and help_.returncode == 0
