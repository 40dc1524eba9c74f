"""``arborl serve`` through the real CLI: it prints its URL, answers the openai client, stops on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from openai import OpenAI


def test_arborl_serve_answers_the_openai_client_and_stops_on_sigterm(checkpoint):
    cmd = [sys.executable, "-m", "arborl.cli", "serve", str(checkpoint), "--port", "0", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://\S+/v1)", line)
        assert url, (line, proc.stderr.read() if proc.poll() is not None else "")
        client = OpenAI(base_url=url.group(1), api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.completions.create(model="tiny", prompt=[2, 4], max_tokens=3, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length") and r.policy_version == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_checkpoint_is_one_line_and_exit_code_2(tmp_path):
    cmd = [sys.executable, "-m", "arborl.cli", "serve", str(tmp_path / "nope"), "--port", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"arborl: error: policy checkpoint {str(tmp_path / 'nope')!r} is not a directory; pass a directory written by "
        "save_policy or a downloaded Hugging Face model directory"]
