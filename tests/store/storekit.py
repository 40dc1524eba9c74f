"""Deterministic episodes for store tests."""

from __future__ import annotations

from arborl.trajectory.schema import Episode, ToolCall, Turn


def make_episode(i: int, *, task_type: str = "search", n_turns: int = 4, created_at: float | None = None,
                 reward: float = 0.25, success: float | None = 1.0, source: str = "rl", iteration: int = 0,
                 policy_version: int = 0, tags: list[str] | None = None, branch: bool = False) -> Episode:
    """Episode ``i``: a chain of ``n_turns`` turns, each with step reward ``reward``.

    Content depends on ``i`` (and the arguments), so different ``i`` give different content hashes.
    With ``branch=True`` an extra turn hangs off the root *before* the main chain continues, so
    the main path (to the last created leaf) is the chain and the extra turn is off-path.
    """
    ep = Episode(episode_id=f"ep{i:06d}", task_id=f"task{i % 7}", task_type=task_type, group_id=f"g{i // 4}",
                 seed=i, rewards={"success": success}, stop_reason="terminated", policy_version=policy_version,
                 iteration=iteration, source=source, tags=list(tags or []),
                 created_at=1_700_000_000.0 + i if created_at is None else created_at)
    parent = None
    for k in range(n_turns):
        t = Turn(turn_id=f"t{k}", parent_id=parent, index=k, observation=f"obs {i} {k}",
                 prompt_ids=[i, k, 7], output_ids=[k + 1, 2], output_logprobs=[-0.5, -0.25], output_mask=[1, 1],
                 action_text=f"act {k}", action=f"a{k}", reward=reward,
                 tool_call=ToolCall(name="search", arguments={"q": f"q{k}"}) if k % 2 else None,
                 policy_version=policy_version, info={"k": k})
        ep.add_turn(t)
        if branch and k == 0:
            ep.add_turn(Turn(turn_id="side", parent_id="t0", index=1, observation="side", reward=100.0))
        parent = t.turn_id
    return ep


def with_param(url: str, param: str) -> str:
    """``url`` with one more query parameter."""
    return f"{url}{'&' if '?' in url else '?'}{param}"


def kill_writer_mid_ingest(url: str, acks: int, batch: int = 200) -> int:
    """Start ``writer_proc.py`` on ``url``, SIGKILL it after ``acks`` acknowledged batches (while it is
    writing the next one), and return the last episode index whose ``put_many`` had returned."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    writer = str(Path(__file__).parent / "writer_proc.py")
    proc = subprocess.Popen([sys.executable, writer, url, "0", "1000000", str(batch)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    acked: list[str] = []
    try:
        deadline = time.time() + 60
        while len(acked) < acks and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:  # the writer died on its own: let the assertions below report it
                break
            if line.startswith("ok "):
                acked.append(line)
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    acked += [ln for ln in proc.stdout.read().splitlines() if ln.startswith("ok ")]
    assert len(acked) >= acks, f"writer acknowledged only {len(acked)} batches"
    return int(acked[-1].split()[2])
