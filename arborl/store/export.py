"""Parquet export: one row per turn, for DuckDB, pandas and other analytics tools.

Every turn of every matching episode becomes one row (off-path turns of a tree too; filter on
``path_index IS NOT NULL`` for the main path). Episodes are written oldest first, turns in
creation order, in row groups of about ``batch_rows`` rows, so memory stays bounded.

Columns:

================== ================ =========================================================
column             type             meaning
================== ================ =========================================================
episode_id         string           episode id
task_id            string           task instance id
task_type          string           capability bucket
group_id           string           rollout group (GRPO group)
source             string           "synth", "rl", "eval", ...
iteration          int64            training iteration (-1: synthetic/eval)
policy_version     int64            policy version of the episode
episode_reward     double           index ``reward``: sum of step rewards on the main path
success            bool (nullable)  ``rewards["success"] > 0``; null if not scored
stop_reason        string           why the episode ended (``Episode.stop_reason``)
seed               int64 (nullable) environment seed
created_at         timestamp[us]    episode creation time, UTC
tags               list<string>     episode tags
rewards            string           the episode's ``rewards`` dict as JSON
metadata           string           the episode's ``metadata`` dict as JSON
origin             string (nullable) the episode's ``origin`` (branch/tree provenance) as JSON; null if none
turn_id            string           turn id
parent_id          string           parent turn id (null for a root)
turn_seq           int32            creation order of the turn within the episode
path_index         int32 (nullable) position on the main path (null: off the main path)
depth              int32            ``Turn.index`` (depth in the tree)
observation        string           observation text
action_text        string           decoded model output
action             string           parsed action (null if parsing failed)
tool_name          string           tool call name (null if none)
tool_arguments     string           tool call arguments as JSON (null if none)
tool_call_id       string           tool call id (null if none or not given)
valid              bool             action parsed and was legal
result             string           tool/environment result text
reward             double           step reward
terminated         bool             terminal state reached after this turn
truncated          bool             cut by a budget after this turn
error              string           error text, if any
turn_policy_version int64           policy version that sampled this turn
state_key          string           anchor state before the action
n_prompt_tokens    int32            ``len(prompt_ids)``
n_output_tokens    int32            ``len(output_ids)``
prompt_ids         list<int32>      token ids fed to the model
output_ids         list<int32>      token ids generated
output_logprobs    list<float>      behaviour log-probs of ``output_ids``
output_mask        list<int8>       1 = trained on
media_urls         list<string>     URLs of media shown with the observation
media              string           the full ``MediaRef`` list (url, mime, sha256) as JSON
timings            string           ``Turn.timings`` as JSON
info               string           ``Turn.info`` as JSON
================== ================ =========================================================

Every :class:`~arborl.trajectory.schema.Turn` field has its column(s) in :data:`TURN_COLUMNS`;
importing this module fails if a field is missing there (docs/trajectory.md, "Adding a field").
"""

from __future__ import annotations

import json
from typing import Any

from arborl.store.base import StoreError
from arborl.trajectory.schema import TURN_FIELDS, Episode, plain

TURN_COLUMNS: dict[str, tuple[str, ...]] = {
    "turn_id": ("turn_id",), "parent_id": ("parent_id",), "index": ("depth",), "observation": ("observation",),
    "media": ("media_urls", "media"), "prompt_ids": ("prompt_ids", "n_prompt_tokens"),
    "output_ids": ("output_ids", "n_output_tokens"), "output_logprobs": ("output_logprobs",),
    "output_mask": ("output_mask",), "action_text": ("action_text",), "action": ("action",),
    "tool_call": ("tool_name", "tool_arguments", "tool_call_id"), "valid": ("valid",), "result": ("result",),
    "state_key": ("state_key",), "reward": ("reward",), "terminated": ("terminated",), "truncated": ("truncated",),
    "error": ("error",), "timings": ("timings",), "policy_version": ("turn_policy_version",), "info": ("info",),
}
"""The export column(s) of each Turn field."""
if set(TURN_COLUMNS) != set(TURN_FIELDS):
    raise ImportError(f"Turn fields without an export column: {sorted(set(TURN_FIELDS) - set(TURN_COLUMNS))}; "
                      "add them to TURN_COLUMNS, _schema and episode_rows (docs/trajectory.md: adding a field)")


def _pyarrow() -> Any:
    """pyarrow, or a :class:`StoreError` naming the extra that installs it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401 - the writer lives in this submodule
    except ImportError as e:
        raise StoreError(f"Parquet export needs pyarrow ({e}); install it with: pip install 'arborl[export]'") from None
    return pa


def _schema() -> Any:
    pa = _pyarrow()

    s, i32, i64 = pa.string(), pa.int32(), pa.int64()
    return pa.schema([
        ("episode_id", s), ("task_id", s), ("task_type", s), ("group_id", s), ("source", s),
        ("iteration", i64), ("policy_version", i64), ("episode_reward", pa.float64()),
        ("success", pa.bool_()), ("stop_reason", s), ("seed", i64), ("created_at", pa.timestamp("us", tz="UTC")),
        ("tags", pa.list_(s)), ("rewards", s), ("metadata", s), ("origin", s), ("turn_id", s), ("parent_id", s), ("turn_seq", i32),
        ("path_index", i32), ("depth", i32), ("observation", s), ("action_text", s), ("action", s),
        ("tool_name", s), ("tool_arguments", s), ("tool_call_id", s), ("valid", pa.bool_()), ("result", s),
        ("reward", pa.float64()), ("terminated", pa.bool_()), ("truncated", pa.bool_()), ("error", s),
        ("turn_policy_version", i64), ("state_key", s), ("n_prompt_tokens", i32), ("n_output_tokens", i32),
        ("prompt_ids", pa.list_(i32)), ("output_ids", pa.list_(i32)), ("output_logprobs", pa.list_(pa.float32())),
        ("output_mask", pa.list_(pa.int8())), ("media_urls", pa.list_(s)), ("media", s), ("timings", s),
        ("info", s),
    ])


def episode_rows(ep: Episode) -> list[dict[str, Any]]:
    """The export rows of one episode (one per turn, creation order)."""
    from datetime import UTC, datetime

    pos = {t.turn_id: i for i, t in enumerate(ep.path())}
    reward = float(sum(t.reward for t in ep.path()))
    head = {
        "episode_id": ep.episode_id, "task_id": ep.task_id, "task_type": ep.task_type, "group_id": ep.group_id,
        "source": ep.source, "iteration": ep.iteration, "policy_version": ep.policy_version,
        "episode_reward": reward, "success": ep.success, "stop_reason": ep.stop_reason, "seed": ep.seed,
        "created_at": datetime.fromtimestamp(ep.created_at, tz=UTC), "tags": list(ep.tags),
        "rewards": json.dumps(ep.rewards), "metadata": json.dumps(ep.metadata),
        "origin": None if ep.origin is None else json.dumps(plain(ep.origin)),
    }
    rows = []
    for k, t in enumerate(ep.turns):
        tc = t.tool_call
        rows.append({
            **head, "turn_id": t.turn_id, "parent_id": t.parent_id, "turn_seq": k,
            "path_index": pos.get(t.turn_id), "depth": t.index, "observation": t.observation,
            "action_text": t.action_text, "action": t.action, "tool_name": tc.name if tc else None,
            "tool_arguments": json.dumps(tc.arguments) if tc else None, "tool_call_id": tc.call_id if tc else None,
            "valid": t.valid, "result": t.result,
            "reward": t.reward, "terminated": t.terminated, "truncated": t.truncated, "error": t.error,
            "turn_policy_version": t.policy_version, "state_key": t.state_key,
            "n_prompt_tokens": len(t.prompt_ids), "n_output_tokens": len(t.output_ids),
            "prompt_ids": t.prompt_ids, "output_ids": t.output_ids, "output_logprobs": t.output_logprobs,
            "output_mask": t.output_mask, "media_urls": [m.url for m in t.media],
            "media": json.dumps([{"url": m.url, "mime": m.mime, "sha256": m.sha256} for m in t.media]),
            "timings": json.dumps(t.timings), "info": json.dumps(t.info),
        })
    return rows


def write_parquet(store: Any, path: str, *, batch_rows: int = 50_000, **filters: Any) -> int:
    """Write the turns of every episode matching ``filters`` to one Parquet file.

    Args:
        store: A trajectory store (anything with ``iter_episodes``).
        path: Output file; written to ``path + ".tmp"`` then renamed, so a reader never sees a
            half-written file.
        batch_rows: Rows per row group.
        **filters: Store filters.

    Returns:
        Number of rows written.
    """
    import os

    pa = _pyarrow()
    pq = pa.parquet
    schema = _schema()
    tmp = f"{path}.tmp"
    n = 0
    buf: list[dict[str, Any]] = []
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for ep in store.iter_episodes(**filters):
            buf += episode_rows(ep)
            if len(buf) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(buf, schema=schema))
                n += len(buf)
                buf = []
        if buf or n == 0:
            writer.write_table(pa.Table.from_pylist(buf, schema=schema))
            n += len(buf)
    os.replace(tmp, path)
    return n
