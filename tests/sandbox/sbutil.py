"""Helpers shared by the sandbox threat probes (imported by conftest.py and the test modules)."""

from __future__ import annotations

import os
import secrets

import pytest

from arborl.sandbox import Limits, Sandbox
from arborl.sandbox.core import probe_backend

# Set before any sandbox starts: if it shows up inside, the environment leaked.
CANARY = "arborl-canary-" + secrets.token_hex(12)
os.environ["ARBORL_TEST_SECRET"] = CANARY

LIMITS = Limits(wall_s=4.0, cpu_s=3.0, memory_mb=192, pids=48, disk_mb=16, output_bytes=64 << 10)


def require_backend(name: str) -> None:
    """Skip (or fail under ARBORL_REQUIRE_SERVICES=1) if backend ``name`` does not work here."""
    reason = probe_backend(name)
    if reason is None:
        return
    if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but sandbox backend {name!r} is unavailable: {reason}")
    pytest.skip(f"sandbox backend {name!r} unavailable: {reason}")


def require(sb: Sandbox, prop: str) -> None:
    """Skip a probe of a property the backend documents that it does not provide."""
    claimed = getattr(type(sb._backend), "guarantees", None)
    if claimed is not None and prop not in claimed:
        pytest.skip(f"backend {sb.backend_name!r} documents that it does not isolate {prop!r}")


def run_ok(sb: Sandbox, code: str, **kw: object) -> str:
    """Run ``code``; assert the snippet itself succeeded; return its stdout."""
    res = sb.run_python(code, **kw)  # type: ignore[arg-type]
    assert res.exit_code == 0 and not res.timed_out and res.error is None, (
        res.exit_code,
        res.stderr[-2000:],
        res,
    )
    return res.stdout
