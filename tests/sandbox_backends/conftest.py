"""Fixtures for the docker and wasm backend tests: a private dockerd, a ready wasm runtime.

A missing prerequisite skips the tests with the reason, or fails them when
``ARBORL_REQUIRE_SERVICES=1`` (CI runs ``scripts/setup/docker.sh`` and ``wasm.sh`` first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from backendkit import FakeProxy, docker_cli, need


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """A dockerd of our own (temp data/exec root, no bridge, no iptables), with the image built."""
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        need("dockerd/docker not installed (run scripts/setup/docker.sh)")
    if os.geteuid() != 0:
        need("starting a private dockerd needs root")
    root = tempfile.mkdtemp(prefix="arborl-dockerd-", dir="/tmp")  # short: unix socket path limit
    host = f"unix://{root}/docker.sock"
    log = open(os.path.join(root, "dockerd.log"), "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        ["dockerd", "--host", host, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec",
         "--pidfile", f"{root}/docker.pid", "--bridge", "none", "--iptables=false", "--ip-masq=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while docker_cli(host, "version").returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                with open(os.path.join(root, "dockerd.log"), errors="replace") as f:
                    tail = f.read()[-1500:]
                need(f"private dockerd did not start: {tail}")
            time.sleep(0.2)
        from arborl.sandbox._docker_image import ensure_image

        ensure_image(docker_host=host)
        yield host
    finally:
        ids = docker_cli(host, "ps", "-aq").stdout.split() if proc.poll() is None else []
        if ids:
            docker_cli(host, "rm", "-f", *ids)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def wasm_ready() -> str:
    """Path of python.wasm, with the compiled module already cached (``scripts/setup/wasm.sh``)."""
    try:
        import wasmtime  # noqa: F401
    except ImportError:
        need("wasmtime is not installed (pip install 'arborl[sandbox]' or scripts/setup/wasm.sh)")
    from arborl.sandbox import _wasm_runtime as rt
    from arborl.sandbox.base import SandboxError

    try:
        path = rt.locate_python_wasm()
    except SandboxError as exc:
        need(str(exc))
    rt.compiled_module(path)  # compiles here once if the setup script did not
    return path


@pytest.fixture
def fake_proxy() -> Iterator[FakeProxy]:
    d = tempfile.mkdtemp(prefix="arborl-proxy-")
    proxy = FakeProxy(os.path.join(d, "proxy.sock"))
    yield proxy
    proxy.close()
    shutil.rmtree(d, ignore_errors=True)
