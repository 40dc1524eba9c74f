"""Probes: what a run is given and why it ended are reported exactly, never silently changed.

- stdin larger than ``disk_mb`` used to be cut at ``disk_mb`` (RLIMIT_FSIZE applies to the memfd
  it is served from) while the run reported ``ok=True``;
- a snippet that ignores SIGXCPU used to end as ``exit -9`` with ``timed_out=False``: the hard
  RLIMIT_CPU kill must read as the CPU limit it is.
"""

from __future__ import annotations

import hashlib

from sbutil import LIMITS

from arborl.sandbox import Limits, Sandbox

MB = 1 << 20


def test_stdin_larger_than_disk_arrives_whole(backend_name: str) -> None:
    limits = Limits(wall_s=20.0, cpu_s=10.0, memory_mb=256, pids=LIMITS.pids, disk_mb=8, output_bytes=4096)
    stdin = "".join(f"{i:07d}\n" for i in range(40 * MB // 8))  # 40 MiB, every line distinct
    assert len(stdin) == 40 * MB
    code = "import hashlib, sys\ndata = sys.stdin.buffer.read()\nprint(len(data), hashlib.sha256(data).hexdigest())"
    with Sandbox(backend_name, limits) as sb:
        res = sb.run_python(code, stdin=stdin)
    if res.ok:
        assert res.stdout.split() == [str(40 * MB), hashlib.sha256(stdin.encode()).hexdigest()], res.stdout
    else:  # refusing is allowed, but only as a sandbox error that says why
        assert res.error is not None and "stdin" in res.error, res


def test_cpu_limit_reads_as_timed_out_when_sigxcpu_is_ignored(backend_name: str) -> None:
    limits = Limits(
        wall_s=12.0, cpu_s=1.0, memory_mb=LIMITS.memory_mb, pids=LIMITS.pids, disk_mb=LIMITS.disk_mb
    )
    code = (
        "import signal\n"
        "if hasattr(signal, 'SIGXCPU'):\n"
        "    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "while True:\n"
        "    pass\n"
    )
    with Sandbox(backend_name, limits) as sb:
        res = sb.run_python(code)
    assert not res.ok and res.timed_out, res
    assert res.duration_s < limits.wall_s, res  # the CPU limit ended it, not the wall deadline


def test_a_snippet_killing_itself_early_is_no_limit_hit(sandbox: Sandbox) -> None:
    # A SIGKILL far from the CPU limit is the snippet's own doing (where it can kill itself at all:
    # the zygote's runner is pid 1 of its namespace and ignores it).
    res = sandbox.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('survived')")
    assert not res.timed_out and not res.memory_exceeded, res
    if res.exit_code == 1:  # no os.kill at all (wasm)
        assert "has no attribute 'kill'" in res.stderr, res
    else:
        assert res.exit_code == -9 or (res.exit_code, res.stdout) == (0, "survived\n"), res
