"""Parquet export (read back with DuckDB and pandas) and the `arborl store` CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from storekit import make_episode

from arborl.store import open_store
from arborl.store.cli import add_store_commands, main

pa = pytest.importorskip("pyarrow")


@pytest.fixture
def filled(sqlite_url):
    eps = [make_episode(i, task_type="search" if i % 2 else "code", policy_version=i % 3, branch=(i == 0),
                        success=1.0 if i % 4 else 0.0) for i in range(8)]
    with open_store(sqlite_url) as store:
        store.put_many(eps)
    return sqlite_url, eps


def test_export_one_row_per_turn_readable_by_duckdb_and_pandas(filled, tmp_path):
    url, eps = filled
    out = str(tmp_path / "turns.parquet")
    with open_store(url) as store:
        n = store.export_parquet(out, task_type="code")
    code = [e for e in eps if e.task_type == "code"]
    assert n == sum(len(e.turns) for e in code) == 4 * 4 + 1  # ep0 has one extra off-path turn
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    got = con.execute(
        f"SELECT episode_id, count(*), sum(reward) FILTER (WHERE path_index IS NOT NULL), "
        f"max(path_index), any_value(episode_reward) FROM '{out}' GROUP BY episode_id ORDER BY episode_id").fetchall()
    assert got == [("ep000000", 5, 1.0, 3, 1.0), ("ep000002", 4, 1.0, 3, 1.0), ("ep000004", 4, 1.0, 3, 1.0),
                   ("ep000006", 4, 1.0, 3, 1.0)]
    side = con.execute(f"SELECT turn_id, path_index, reward FROM '{out}' WHERE path_index IS NULL").fetchall()
    assert side == [("side", None, 100.0)]
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(out)
    row = df[(df.episode_id == "ep000002") & (df.turn_id == "t1")].iloc[0]
    assert list(row.prompt_ids) == [2, 1, 7] and list(row.output_mask) == [1, 1]
    assert row.tool_name == "search" and json.loads(row.tool_arguments) == {"q": "q1"}
    assert row.turn_seq == 1 and row.path_index == 1 and row.success == True  # noqa: E712


def test_export_with_no_match_writes_an_empty_file(filled, tmp_path):
    url, _ = filled
    out = str(tmp_path / "none.parquet")
    with open_store(url) as store:
        assert store.export_parquet(out, task_type="nothing") == 0
    import pyarrow.parquet as pq

    assert pq.read_table(out).num_rows == 0


def test_cli_query_json(filled, capsys):
    url, _ = filled
    assert main(["query", url, "--task-type", "search", "--limit", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["episode_id"] for e in out["episodes"]] == ["ep000007", "ep000005"]
    assert out["next_cursor"]
    assert main(["query", url, "--task-type", "search", "--cursor", out["next_cursor"], "--json"]) == 0
    out2 = json.loads(capsys.readouterr().out)
    assert [e["episode_id"] for e in out2["episodes"]] == ["ep000003", "ep000001"]


def test_cli_profile_table_and_json(filled, capsys):
    url, _ = filled
    assert main(["profile", url, "--group-by", "task_type", "--json"]) == 0
    prof = {p["task_type"]: p for p in json.loads(capsys.readouterr().out)}
    # code: i = 0,2,4,6 -> success where i % 4 != 0 -> 2 of 4
    assert prof["code"]["count"] == 4 and prof["code"]["success_rate"] == 0.5
    assert prof["search"]["success_rate"] == 1.0
    assert main(["profile", url]) == 0
    table = capsys.readouterr().out
    assert "capability profile" in table and "search" in table and "50.0%" in table


def test_cli_slice_export_expire_and_errors(filled, tmp_path, capsys):
    url, _ = filled
    assert main(["slice", url, "ep000003", "--start", "1", "--stop", "3", "--json"]) == 0
    assert [t["turn_id"] for t in json.loads(capsys.readouterr().out)] == ["t1", "t2"]
    out = str(tmp_path / "x.parquet")
    assert main(["export", url, out, "--source", "rl", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 33
    assert main(["expire", url]) == 2
    assert "--older-than" in capsys.readouterr().err
    assert main(["expire", url, "--older-than", "1d", "--task-type", "code", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": 4}  # created in 2023, far older than a day
    assert main(["slice", url, "missing"]) == 2
    assert "no episode 'missing'" in capsys.readouterr().err
    assert main(["query", "mongodb://x/y"]) == 2
    assert "not supported" in capsys.readouterr().err


def test_cli_hooks_into_a_parent_parser(filled, capsys):
    import argparse

    url, _ = filled
    parser = argparse.ArgumentParser(prog="arborl")
    add_store_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["store", "query", url, "--limit", "1", "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["episodes"][0]["episode_id"] == "ep000007"


def test_cli_as_a_module(filled):
    url, _ = filled
    r = subprocess.run([sys.executable, "-m", "arborl.store.cli", "profile", url, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sum(p["count"] for p in json.loads(r.stdout)) == 8


def test_cli_does_not_create_a_missing_store(tmp_path, capsys):
    assert main(["profile", f"sqlite:///{tmp_path}/missing.db"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
