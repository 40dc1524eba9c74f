"""A real two-node Ray cluster on loopback, started by the tests and stopped at the end.

``ray start --head`` and a second ``ray start --address`` run as ``--block`` subprocesses of
this session (stopping them stops exactly their Ray processes, never another cluster on the
machine), with one CPU and a 100 MB object store each. Their workers import this tree
(``PYTHONPATH``), and this folder for the test-only envs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict[str, str]:
    """The environment of the Ray nodes and of CLI drivers that join them.

    A node stopped by SIGTERM first drains for up to ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``
    (30 s by default, for Serve proxies to quiesce); a test cluster has nothing to drain, so 0
    tears it down at once (34 s -> ~1 s per test session).
    """
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "ARBORL_PROGRESS": "0",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",  # a loopback test cluster: no token
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


KWARGS = {"size": 4, "obs_format": "rows+cols"}
"""The FrozenLake settings of the generation tests."""


def tiny_checkpoints(root: Path, seeds: tuple[int, ...]) -> list[Path]:
    """Tiny FrozenLake policies with random weights, one per seed, sharing one tokenizer."""
    from arborl.env.envs import FrozenLake
    from arborl.policy import ModelConfig, build_model, save_policy, train_tokenizer

    env, corpus = FrozenLake(**KWARGS), list(FrozenLake.actions)
    for seed in range(10):
        corpus.append(env.format_observation(env.reset(seed=seed)[0]))
    tok = train_tokenizer(corpus)
    shape = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                        max_position_embeddings=512)
    return [save_policy(build_model(shape, tok, seed=s), tok, root / f"m{s}") for s in seeds]


@dataclass
class Cluster:
    address: str
    """The head's GCS address, HOST:PORT (what ``cluster.address`` joins)."""


def _alive_nodes(address: str) -> int:
    code = (f"import ray, logging; ray.init(address={address!r}, logging_level=logging.ERROR); "
            "print(sum(n['Alive'] for n in ray.nodes()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ray_env(), timeout=120)
    return int(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else 0


def _node(*args: str, temp: str) -> subprocess.Popen:
    common = ["--block", "--num-cpus", "1", "--object-store-memory", str(100 * 2**20), "--node-ip-address",
              "127.0.0.1", "--disable-usage-stats", "--dashboard-agent-listen-port", str(_free_port()),
              "--metrics-export-port", str(_free_port())]
    log = open(Path(temp) / f"node-{len(os.listdir(temp))}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen([str(RAY), "start", *args, *common], env=ray_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.fixture(scope="session")
def ray_cluster():
    if not RAY.exists():
        pytest.skip("Ray is not installed (pip install 'arborl[ray]')")
    temp = tempfile.mkdtemp(prefix="arb-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    address = f"127.0.0.1:{port}"
    nodes = [_node("--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp, temp=temp)]
    try:
        deadline = time.monotonic() + 180
        while _alive_nodes(address) < 1:
            if time.monotonic() > deadline or nodes[0].poll() is not None:
                raise RuntimeError(f"the Ray head did not start; see {temp}/node-0.log")
            time.sleep(1)
        nodes.append(_node("--address", address, temp=temp))
        while _alive_nodes(address) < 2:
            if time.monotonic() > deadline or nodes[1].poll() is not None:
                raise RuntimeError(f"the second Ray node did not join; see {temp}/node-1.log")
            time.sleep(1)
        yield Cluster(address)
    finally:
        for p in reversed(nodes):  # `ray start --block` stops its node's processes on SIGTERM
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in nodes:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture()
def ray_driver(ray_cluster, monkeypatch):
    """This test process joined to the cluster (``ray.init``), shut down afterwards."""
    import logging

    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")

    ray.init(address=ray_cluster.address, logging_level=logging.ERROR, log_to_driver=False, namespace="arborl-test")
    try:
        yield ray
    finally:
        ray.shutdown()
