"""The FinQA tool env: contract, oracle trajectories, the sandboxed python tool, data files, eval figures."""

from __future__ import annotations

import json

import pytest
import torch

from arborl.config import ConfigError
from arborl.env import check_env
from arborl.finqa.data import generate_example, write_jsonl
from arborl.finqa.env import calculator_call, episode_metrics, finqa_env
from arborl.policy import ChatRenderer
from arborl.policy.tokenizer import train_tokenizer
from arborl.rollout import EpisodeSpec, RolloutConfig, SamplingConfig, ScriptedPolicy, run_episodes


def test_check_env_passes_and_the_noisy_teacher_is_not_held_to_success():
    env = finqa_env(sandbox="none")
    check_env(env)
    assert env.deterministic is True
    noisy = finqa_env(sandbox="none", oracle_error=0.5)
    assert noisy.deterministic is False
    check_env(noisy)


@pytest.mark.parametrize("oracle_error", [0.0, 1.0])
def test_oracle_calls_the_calculator_then_answers(oracle_error):
    """oracle_error 0: every question solved with one calculator call; 1: every demonstration is the flawed one."""
    env = finqa_env(sandbox="none", oracle_error=oracle_error)
    kinds = set()
    for seed in range(60):
        env.reset(seed=seed)
        ex = generate_example(seed, test=False)
        kinds.add(ex.kind)
        call = env.expert_action()
        assert call == calculator_call(ex.flawed_expression if oracle_error else ex.expression)
        first = env.step(call)
        assert first.info["tool_call"]["name"] == "calculator" and not first.terminated
        assert first.obs.startswith("<tool_response>")
        answer = env.expert_action()
        assert answer == f"<answer> {env.last_results[0]} </answer>"
        last = env.step(answer)
        assert last.terminated and last.reward == (0.0 if oracle_error else 1.0), (seed, ex)
    assert len(kinds) >= 5


def test_held_out_seeds_read_held_out_companies():
    env = finqa_env(sandbox="none", heldout_from=1000)
    env.reset(seed=1003)
    assert env.task.id == generate_example(3, test=True).id
    assert generate_example(3, test=True).company in env.task.question
    env.reset(seed=3)
    assert generate_example(3, test=False).company in env.task.question


def test_python_tool_runs_in_the_sandbox_and_is_released():
    env = finqa_env(sandbox="bwrap")
    env.reset(seed=0)
    code = {"name": "python", "arguments": {"code": "print(round((520 - 445) / 445 * 100, 1))"}}
    res = env.step(f"<tool_call>{json.dumps(code)}</tool_call>")
    assert res.info["action_valid"] and res.obs == "<tool_response>\n16.9\n</tool_response>"
    assert env.lifecycle["created"] == 1
    env.step("<answer> 16.9 </answer>")
    assert env.lifecycle == {"created": 1, "released": 1, "release_errors": 0}


def test_bad_kwargs_are_config_errors():
    with pytest.raises(ConfigError, match="sandbox"):
        finqa_env(sandbox="vm")
    with pytest.raises(ConfigError, match="oracle_error"):
        finqa_env(oracle_error=1.5)
    with pytest.raises(ConfigError, match="spaced_digits = 'yes'; use true or false"):
        finqa_env(spaced_digits="yes")
    with pytest.raises(ConfigError, match="whole_labels = 1; use true or false"):
        finqa_env(spaced_digits=True, whole_labels=1)
    with pytest.raises(ConfigError, match="whole_labels = true needs spaced_digits = true"):
        finqa_env(whole_labels=True)


def test_tasks_from_jsonl_files(tmp_path):
    train = [generate_example(s, test=False) for s in range(3)]
    test = [generate_example(s, test=True) for s in range(2)]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "test.jsonl", test)
    env = finqa_env(sandbox="none", train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"),
                    heldout_from=100)
    ids = []
    for seed in (0, 1, 2, 3, 100, 101, 102):
        env.reset(seed=seed)
        ids.append(env.task.id)
    assert ids == [train[0].id, train[1].id, train[2].id, train[0].id, test[0].id, test[1].id, test[0].id]
    check_env(env)


def test_episode_metrics_count_parse_failures_and_calls():
    """Real rollouts of a scripted policy: right, wrong, unparseable and never-answered episodes."""
    env_fn = lambda: finqa_env(sandbox="none", max_steps=3)  # noqa: E731
    answers = {0: None, 1: "<answer> 1e9 </answer>", 2: "<answer> about five </answer>", 3: "<answer> $ </answer>"}

    def act(env):
        seed = int(env.task.id.rsplit("-", 1)[1])
        if answers[seed] is None:  # two calls, then a turn that is neither a call nor an answer
            return calculator_call(env.task.metadata["expression"]) if env.steps < 2 else "no call and no answer"
        return answers[seed] if env.last_results else env.expert_action()

    tok = train_tokenizer(["a"], extra_words=["x"])
    specs = [EpisodeSpec(task_id=f"t{s}", task_type="finqa", group_id="g", seed=s) for s in range(4)]
    cfg = RolloutConfig(max_turns=3, max_context_tokens=4096, sampling=SamplingConfig(max_new_tokens=8))
    eps = run_episodes(ScriptedPolicy(act, ChatRenderer(tok)), env_fn, specs, cfg, generator=torch.Generator())
    m = episode_metrics(eps)
    # seed 0: two calculator calls, then an invalid turn, no answer; seeds 1-3 one call each
    assert m == {"parse_failures": 2.0, "unanswered": 1.0, "tool_calls_per_question": 5 / 4,
                 "calculator_calls_per_question": 5 / 4, "lookup_calls_per_question": 0.0}


def diff_player(env):
    """The first ``diff`` question of the training seeds, and ``play(*actions)``: its step metrics after them."""
    seed = next(s for s in range(50) if generate_example(s, test=False).kind == "diff")

    def play(*actions):
        env.reset(seed=seed)
        for action in actions:
            res = env.step(action)
        return res.info["metrics"]

    return generate_example(seed, test=False), play


def test_step_metrics_tell_wrong_cells_wrong_arithmetic_and_an_answer_that_is_not_the_result():
    ex, play = diff_player(finqa_env(sandbox="none"))  # e.g. "961 - 986"; the flawed one is "986 - 961"
    # right_diff: the answer's reward under its kind's name (the per-kind accuracy), whatever the calls
    a, b = ex.expression.split(" - ")
    right = str(int(a) - int(b))
    assert play(calculator_call(ex.expression), f"<answer> {right} </answer>") == {
        "operands_right": 1.0, "result_right": 1.0, "answer_is_result": 1.0, "right_diff": 1.0}
    # the right cells the wrong way round: the cells are right, the arithmetic is not; the answer copies the result
    assert play(calculator_call(ex.flawed_expression), f"<answer> {int(b) - int(a)} </answer>") == {
        "operands_right": 1.0, "result_right": 0.0, "answer_is_result": 1.0, "right_diff": 0.0}
    # a cell that is not in the gold; then an answer that is not what the calculator said
    assert play(calculator_call(f"{a} - 1000"), f"<answer> {right} </answer>") == {
        "operands_right": 0.0, "result_right": 0.0, "answer_is_result": 0.0, "right_diff": 1.0}
    # a right second call counts for result_right, only the first call for operands_right
    assert play(calculator_call("2 + 2"), calculator_call(ex.expression), f"<answer> {right} </answer>") == {
        "operands_right": 0.0, "result_right": 1.0, "answer_is_result": 1.0, "right_diff": 1.0}
    assert play(f"<answer> {right} </answer>") == {"operands_right": 0.0, "result_right": 0.0, "right_diff": 1.0}  # no call
