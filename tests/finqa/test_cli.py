"""A tiny FinQA run through the real CLI: synth -> sft -> rl -> eval, and the figures summary.json holds."""

from __future__ import annotations

import json

from arborl.config import load_config
from arborl.train.common import env_factory
from arborl.train.config import TrainConfig
from tests.e2e.clikit import arborl, cli_env

TINY = [
    "synth.episodes=24", "sft.steps=3", "sft.batch_size=4", "rl.iterations=2", "rl.tasks_per_iter=2",
    "rl.group_size=2", "rl.minibatch_size=4", "eval.episodes=6", "eval.probe_episodes=2",
    "policy.tokenizer_episodes=10", "policy.model.hidden_size=32", "policy.model.intermediate_size=64",
    "policy.model.num_heads=2", "policy.model.num_kv_heads=2", "threads=1", "rollout.sampling.max_new_tokens=12",
]


def test_finqa_recipe_end_to_end(tmp_path):
    run = tmp_path / "run"
    args = ["train", "examples/finqa.toml", "--set", f'run_dir="{run}"']
    for kv in TINY:
        args += ["--set", kv]
    arborl(*args, env=cli_env())
    summary = json.loads((run / "summary.json").read_text())
    for stage in ("sft", "rl"):
        figures = summary[stage]
        assert 0.0 <= figures["success"] <= 1.0
        assert figures["parse_failures"] == int(figures["parse_failures"]) >= 0
        assert 0 <= figures["unanswered"] <= 6
        assert figures["tool_calls_per_question"] >= figures["calculator_calls_per_question"] >= 0
        # the step metrics of every episode the env ended (one cut at rollout.max_turns reports none)
        ended = figures.get("operands_right_n", 0)
        assert figures.get("result_right_n", 0) == ended <= 6 and figures.get("answer_is_result_n", 0) <= ended
        assert all(0 <= figures[k] <= 1 for k in ("operands_right", "result_right") if k in figures)
    assert summary["rl_gain"] == summary["rl"]["success"] - summary["sft"]["success"]
    assert summary["demo_episodes"] == 24
    # the teacher is wrong on oracle_error = 0.6 of the questions and its wrong demonstrations are kept
    synth_success = summary["config"]["env"]["kwargs"]["oracle_error"]
    assert synth_success == 0.6
    # every held-out question was asked of a held-out company
    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        evals = [e for e in store.iter_episodes(source="eval-rl")]
        demos = list(store.iter_episodes(source="synth"))
    assert len(evals) == 6 and all(e.seed >= 1_000_000_000 for e in evals)
    assert 0 < sum(e.success for e in demos) < len(demos)  # right and wrong demonstrations
    # the example's protocol: the cells are looked up (the statement is not in the prompt), then the calculator
    names = [t.tool_call.name if t.tool_call is not None else None for t in demos[0].path()]
    assert names[0] == "lookup" and names[-2:] == ["calculator", None], names
    assert "lookups_complete" in summary["rl"] and "lookup_calls_per_question" in summary["rl"]  # lookups_right: once one is made


def test_the_statement_layout_stays_reachable_from_the_example():
    """``--set env.kwargs.lookup=false --set env.kwargs.statement=true``: the statement in the prompt, no lookup tool."""
    cfg = load_config(TrainConfig, "examples/finqa.toml", ["env.kwargs.lookup=false", "env.kwargs.statement=true"])
    env = env_factory(cfg.env)()
    obs, _ = env.reset(seed=0)
    assert "lookup" not in env.table and "items :" not in obs[1]["content"]
    assert sorted(env.table) == ["calculator", "python"] and env.expert_action().count('"calculator"') == 1
    example = env_factory(load_config(TrainConfig, "examples/finqa.toml").env)()
    obs, _ = example.reset(seed=0)
    assert "lookup" in example.table and "items :" in obs[1]["content"]
