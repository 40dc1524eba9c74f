"""``python -m arborl.proxy serve`` end to end: config file plus flags, a request, SIGTERM, final counters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from proxy_helpers import Upstream, fetch


def test_serve_runs_in_foreground_and_reports_counters(
    proxy_venv: str, upstream: Upstream, tmp_path: Path
) -> None:
    port = upstream.server_address[1]
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'allow = ["api.test"]\nallow_private = ["api.test:{port}"]\n[resolve]\n"api.test" = "127.0.0.1"\n'
    )
    cache = tmp_path / "cli.sqlite"
    cmd = [sys.executable, "-m", "arborl.proxy", "serve", "--config", str(config)]
    cmd += ["--mode", "record", "--cache", str(cache), "--port", "0", "--deny", "ads.test"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["mode"] == "record" and Path(info["socket"]).exists()
        assert fetch(info["url"], f"http://api.test:{port}/cli").body == b"upstream saw /cli"
        assert fetch(info["url"], "http://ads.test/").status == 403
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert (stats["recorded"], stats["refused_policy"], stats["cache_entries"]) == (1, 1, 1)
    assert not Path(info["socket"]).exists()
    assert upstream.hits == 1


def test_serve_rejects_a_bad_config_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('mode = "replay"\n')
    done = subprocess.run(
        [sys.executable, "-m", "arborl.proxy", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "needs cache_path" in done.stderr
