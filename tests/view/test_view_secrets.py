"""The viewer never shows a store password: on the page, in the API, in errors, or in what the CLI prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from clikit import ROOT, cli_env
from viewkit import build_episodes

from arborl.store import open_store

sys.path.insert(0, str(ROOT / "tests" / "store"))

pytestmark = pytest.mark.services
SECRET = "Viewer-S3cret-pw"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A Redis store (password :data:`SECRET`, blobs in a folder) holding the conftest episodes."""
    from store_services import ServiceMissing, redis_server

    try:
        cm = redis_server(password=SECRET)
        server = cm.__enter__()
    except ServiceMissing as e:
        if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but {e}")
        pytest.skip(str(e))
    url = f"{server}?blob=file://{tmp_path_factory.mktemp('blobs')}&prefix=view"
    with open_store(url) as store:
        build_episodes(store)
    yield url
    cm.__exit__(None, None, None)


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.read().decode()


def test_no_password_in_the_page_the_api_or_the_cli(redis_url):
    p = subprocess.Popen([sys.executable, "-m", "arborl.cli", "view", redis_url, "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert SECRET not in line and ":***@" in line, line
        base = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        bodies = [get(base + path) for path in (
            "", "static/app.js", "api/info", "api/episodes", "api/episodes/a", "api/episodes/a/group", "api/profile",
            "api/episodes?cursor=bad", "api/episodes/nope", "api/count?success=maybe")]
        assert '"episode_id":"long"' in bodies[3]  # the store answered through the password
        assert ":***@" in bodies[2]
        assert all(SECRET not in b for b in bodies)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert SECRET not in err
    wrong = redis_url.replace(SECRET, "Wr0ng-" + SECRET)
    r = subprocess.run([sys.executable, "-m", "arborl.cli", "view", wrong, "--port", "0"], capture_output=True,
                       text=True, env=cli_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 2 and SECRET not in r.stderr + r.stdout and r.stderr.count("\n") == 1, r.stderr
