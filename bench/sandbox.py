"""Sandbox latency and throughput for ``print(1)``, per available backend, in one table.

Usage::

    python bench/sandbox.py                 # every available backend, 40 runs each
    python bench/sandbox.py --runs 100 --backends bwrap zygote

For each backend: min, p50 and p90 latency of one ``run_python("print(1)")`` call (sequential,
back to back unless ``--gap-ms`` spaces them, after warm-up), and runs per second at concurrency 1 and 4 (a thread pool). When docker works, two
reference rows are added -- ``docker exec`` into a warm container (the docker backend's default)
and ``docker run --rm`` (its cold path, ``warm=False``) -- and every row shows how many times
faster than each its p50 is. Targets: zygote p50 <= 5 ms, bwrap p50 <= 30 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from arborl.sandbox import Limits, Sandbox, SandboxError
from arborl.sandbox.core import backend_class

CODE = "print(1)"
LIMITS = Limits(wall_s=10.0, cpu_s=5.0, memory_mb=256, pids=64, disk_mb=64)
TARGETS_MS = {"zygote": 5.0, "bwrap": 30.0}


@dataclass
class Row:
    """One measured backend (or reference path)."""

    name: str
    min_ms: float
    p50_ms: float
    p90_ms: float
    rps_1: float | None
    rps_4: float | None


def _latencies(run: object, n: int, gap_s: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)  # caller "think time" between calls (e.g. the model generating)
        t = time.perf_counter()
        res = run(CODE)  # type: ignore[operator]
        out.append((time.perf_counter() - t) * 1000)
        if res.stdout.strip() != "1":
            raise SandboxError(f"unexpected result {res!r}")
    return out


def _throughput(run: object, n: int, workers: int) -> float:
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: run(CODE), range(n)))  # type: ignore[operator]
    return n / (time.perf_counter() - t)


def _p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1]


def measure(name: str, runs: int, *, gap_s: float = 0.0, throughput: bool = True) -> Row:
    """Measure one backend by name (latency of sequential calls ``gap_s`` apart)."""
    with Sandbox(name, LIMITS) as sb:
        _latencies(sb.run_python, 3)  # warm-up: worker start, page cache
        lat = _latencies(sb.run_python, runs, gap_s)
        rps1 = _throughput(sb.run_python, runs, 1) if throughput else None
        if throughput:
            _throughput(sb.run_python, 8, 4)  # warm-up: a pooled backend starts its extra workers here
        rps4 = _throughput(sb.run_python, runs, 4) if throughput else None
    return Row(name, min(lat), statistics.median(lat), _p90(lat), rps1, rps4)


def measure_docker_cold(runs: int) -> Row | None:
    """``docker run --rm`` through the docker backend's cold path, if it has one."""
    try:
        backend = backend_class("docker")(LIMITS, warm=False)
    except (TypeError, SandboxError) as exc:
        print(f"docker run: n/a ({exc})")
        return None
    try:
        _latencies(backend.run_python, 1)
        lat = _latencies(backend.run_python, runs)
    finally:
        backend.close()
    return Row("docker run (cold)", min(lat), statistics.median(lat), _p90(lat), None, None)


def measure_bwrap_cold(runs: int, gap_s: float = 0.0) -> Row:
    """The bwrap backend without spare sandboxes: every call starts its sandbox (``spares=0``)."""
    backend = backend_class("bwrap")(LIMITS, spares=0)
    try:
        _latencies(backend.run_python, 3)
        lat = _latencies(backend.run_python, runs, gap_s)
    finally:
        backend.close()
    return Row("bwrap cold (spares=0)", min(lat), statistics.median(lat), _p90(lat), None, None)


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def render(rows: list[Row], warm: Row | None, cold: Row | None) -> None:
    """Print the table (rich if installed, else plain text)."""
    header = ["backend", "min ms", "p50 ms", "p90 ms", "runs/s c=1", "runs/s c=4", "x faster than docker exec",
              "x faster than docker run", "target p50"]  # fmt: skip
    body = []
    for r in rows:
        target = TARGETS_MS.get(r.name)
        verdict = "" if target is None else f"<= {target:g} ms: {'met' if r.p50_ms <= target else 'MISSED'}"
        body.append([
            r.name, _fmt(r.min_ms), _fmt(r.p50_ms), _fmt(r.p90_ms), _fmt(r.rps_1), _fmt(r.rps_4),
            _fmt(warm.p50_ms / r.p50_ms if warm else None), _fmt(cold.p50_ms / r.p50_ms if cold else None), verdict,
        ])  # fmt: skip
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=True)]
        for line in [header, *body]:
            print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)))
        return
    table = Table(
        title=f"sandbox: {CODE!r}, latency per call and throughput (host load {os.getloadavg()[0]:.1f})"
    )
    for h in header:
        table.add_column(h, justify="left" if h in ("backend", "target p50") else "right")
    for line in body:
        table.add_row(*line)
    Console(width=max(140, Console().width)).print(table)


def main() -> None:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="runs per measurement (latency and each throughput)")
    ap.add_argument("--cold-runs", type=int, default=10, help="runs of the docker cold path")
    ap.add_argument("--backends", nargs="*", help="backends to measure (default: every available one)")
    ap.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="pause between the sequential latency calls (default 0: back to back)",
    )
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; calls {args.gap_ms:g} ms apart")
    names = args.backends or Sandbox.available_backends()
    rows = []
    for name in names:
        try:
            rows.append(measure(name, args.runs, gap_s=args.gap_ms / 1000))
        except SandboxError as exc:
            print(f"{name}: failed: {exc}")
    if "bwrap" in names and any(r.name == "bwrap" for r in rows):
        rows.append(measure_bwrap_cold(args.runs, args.gap_ms / 1000))
    warm = next((r for r in rows if r.name == "docker"), None)
    cold = measure_docker_cold(args.cold_runs) if "docker" in names and warm is not None else None
    if cold is not None:
        rows.append(cold)
    render(rows, warm, cold)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
