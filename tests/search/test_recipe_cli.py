"""examples/search_r1.toml end to end through the real CLI, on a tiny budget: synth -> sft -> rl -> eval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from arborl.train.common import METRICS

ROOT = Path(__file__).resolve().parents[2]
TINY = ["synth.episodes=40", "sft.steps=4", "sft.batch_size=8", "sft.eval_every=2", "rl.iterations=2",
        "rl.tasks_per_iter=2", "rl.group_size=2", "rl.minibatch_size=4", "rl.eval_every=1", "rl.checkpoint_every=0",
        "eval.episodes=6", "eval.probe_episodes=3", "policy.tokenizer_episodes=10", "policy.model.hidden_size=32",
        "policy.model.intermediate_size=64", "policy.model.num_layers=2", "policy.model.num_heads=2",
        "policy.model.num_kv_heads=2", "report_to=[]"]
ENV_METRICS = ("em", "f1", "searches", "two_hop_used_first", "em_1hop", "em_2hop", "first_query_subject", "gold_retrieved",
               "answer_from_results", "em_new_answer")


def test_search_r1_recipe_runs_end_to_end_and_reports_em_searches_and_two_hop_use(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "arborl.cli", "train", "examples/search_r1.toml", "--set", f'run_dir="{run}"']
    for kv in TINY:
        args += ["--set", kv]
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ARBORL_PROGRESS": "0", "HOME": "/tmp"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "arborl: retriever serving 10060 passages (bm25) at http://127.0.0.1:" in p.stderr
    summary = json.loads((run / "summary.json").read_text())
    for stage in ("sft", "rl"):
        ev = summary[stage]
        assert ev["em"] == ev["success"] and 0 <= ev["f1"] <= 1 and ev["em_n"] == 6
        assert ev["searches_n"] == 6 and 0 < ev["two_hop_used_first_n"] <= 6 and 0 <= ev["two_hop_used_first"] <= 1
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    # an untrained policy may make no valid call in an iteration: tools/search/* then are absent from its row
    assert len(rl) == 2 and all({"tools/calls_per_episode", "tools/time_share", "train/env_errors",
                                 "train/max_context", "train/em", "train/searches"} <= set(r) for r in rl)
    env_keys = {f"{prefix}{m}{suffix}" for prefix in ("", "train/") for m in ENV_METRICS for suffix in ("", "_n")}
    tool_keys = {f"tools/search/{k}" for k in ("calls", "errors", "timeouts")}
    logged = {k for r in rows for k in r}
    assert logged - set(METRICS) - env_keys - tool_keys == set()
    synth = run / "trajectories.db"
    assert synth.exists() and summary["demo_episodes"] == 40
    # the example's scratch tokenizer is a BPE, saved as a plain HF tokenizer beside the policy
    tok = AutoTokenizer.from_pretrained(run / "policy" / "rl")
    assert json.loads((run / "policy" / "rl" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert len(tok) <= 2000 and tok.convert_ids_to_tokens(5) == "<|end|>"
    action = "<answer> Dario Brolkalbra </answer>"
    assert tok.decode(tok.encode(action, add_special_tokens=False)) == action
