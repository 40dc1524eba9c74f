"""Each new credit choice through the real ``arborl rl`` command, on a tiny budget from one SFT checkpoint."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, sets  # noqa: E402


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    run = tmp_path_factory.mktemp("credit-sft") / "run"
    arborl("train", "examples/frozenlake.toml", *sets(run, ['stages=["synth","sft"]', "report_to=[]"]))
    return run / "policy" / "sft"


def rl_rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == "rl"]


@pytest.mark.parametrize("extra", [
    ["rl.credit=rloo"],
    ["rl.credit=dr_grpo", "rl.loss_agg=seq-mean-token-sum-norm"],
    ["rl.credit=grpo", "rl.singleton=zero"],
])
def test_rl_runs_with_each_group_baseline(sft, tmp_path, extra):
    run = tmp_path / "run"
    arborl("rl", "examples/frozenlake.toml",
           *sets(run, [f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", *extra]))
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2] and (run / "policy" / "rl" / "model.safetensors").exists()
    assert all(r["train/filter_kept_frac"] == 1.0 and r["train/filter_empty"] == 0 for r in rows)
    config = (run / "config.toml").read_text()
    assert all(f'{k.split(".")[1].split("=")[0]} = ' in config for k in extra)


def test_rl_with_starpo_s_filter_and_its_stabilisers(sft, tmp_path):
    # 2 tasks per iteration and keep_ratio 0.5: one group of the two is trained on, or none when
    # both groups agree (keep_zero_std = false), which is counted, not crashed on
    run = tmp_path / "run"
    arborl("rl", "examples/frozenlake.toml", *sets(run, [
        f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", "rl.credit=rloo", "rl.filter=starpo_s",
        "rl.keep_ratio=0.5", "rl.keep_zero_std=false", "rl.kl_coef=0", "rl.clip_high=0.28", "rl.iterations=3",
        "rl.group_size=2"]))
    rows = rl_rows(run)
    assert len(rows) == 3
    empty = 0
    for r in rows:
        assert r["train/filter_kept_frac"] in (0.0, 0.5)
        empty += r["train/filter_kept_frac"] == 0.0
        assert r["train/filter_empty"] == empty  # a running count
        assert r["train/kept_frac"] <= 0.5  # the update never sees a dropped group
        assert "loss/kl" not in r  # kl_coef = 0: no reference model, no KL term


def test_rl_with_an_always_empty_starpo_s_selection_counts_it_and_trains_nothing(sft, tmp_path):
    # group_size 1: every group is a single episode, hence std 0, and keep_zero_std = false keeps none
    run = tmp_path / "run"
    arborl("rl", "examples/frozenlake.toml", *sets(run, [
        f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", "rl.credit=grpo", "rl.filter=starpo_s",
        "rl.keep_ratio=1", "rl.keep_zero_std=false", "rl.group_size=1", "rl.eval_every=0"]))
    rows = rl_rows(run)
    assert [(r["train/filter_empty"], r["train/filter_kept_frac"], r["train/kept_frac"], r["tokens"]) for r in rows] \
        == [(1, 0.0, 0.0, 0), (2, 0.0, 0.0, 0)]
    assert not any("loss/policy" in r for r in rows)  # no update was made


@pytest.mark.parametrize("extra", [
    ["rl.credit=turn_ppo", "rl.critic_warmup=1"],
    ["rl.credit=turn_ppo", "rl.critic=separate", "rl.whiten_advantages=false"],
    ["rl.credit=archer", "rl.ppo_epochs=1"],
])
def test_rl_runs_with_each_critic(sft, tmp_path, extra):
    run = tmp_path / "run"
    arborl("rl", "examples/frozenlake.toml",
           *sets(run, [f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", "rl.eval_every=0", *extra]))
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2] and (run / "policy" / "rl" / "model.safetensors").exists()
    critic_keys = {k for k in rows[0] if k.startswith("critic/")}
    assert critic_keys and all(critic_keys <= set(r) for r in rows)  # the critic trained every iteration
    warmup = "rl.critic_warmup=1" in extra
    assert ("loss/policy" in rows[0]) is not warmup and "loss/policy" in rows[1]  # warm-up: the critic only
    assert (rows[0]["tokens"] == 0) is warmup


def test_starpo_s_with_every_stabiliser_runs_through_the_cli(sft, tmp_path):
    # RAGEN's "rollout_filter + Critic + Cliphigh + NoKL": the filter, turn_ppo's critic, clip 0.2 / 0.28, no KL
    run = tmp_path / "run"
    arborl("rl", "examples/frozenlake.toml", *sets(run, [
        f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", "rl.eval_every=0", "rl.filter=starpo_s",
        "rl.keep_ratio=0.5", "rl.credit=turn_ppo", "rl.kl_coef=0", "rl.clip_low=0.2", "rl.clip_high=0.28"]))
    rows = rl_rows(run)
    assert len(rows) == 2
    for r in rows:
        assert r["train/filter_kept_frac"] == 0.5 and r["train/kept_frac"] <= 0.5
        assert "loss/kl" not in r and "critic/loss" in r


@pytest.mark.slow
@pytest.mark.parametrize("credit", [["rl.credit=turn_ppo", "rl.critic=separate"], ["rl.credit=archer"]])
def test_resume_with_a_critic_continues_exactly(sft, tmp_path, credit):
    from safetensors.torch import load_file

    straight, split = tmp_path / "straight", tmp_path / "split"
    base = [f'policy.init="{sft}"', "rl.branch=false", "report_to=[]", "rl.eval_every=0", "rl.warmup_iters=0",
            'rl.lr_schedule="constant"', *credit]
    arborl("rl", "examples/frozenlake.toml", *sets(straight, [*base, "rl.iterations=3", "rl.checkpoint_every=0"]))
    arborl("rl", "examples/frozenlake.toml", *sets(split, [*base, "rl.iterations=1"]))
    arborl("rl", "examples/frozenlake.toml", "--resume", *sets(split, [*base, "rl.iterations=3"]))
    a, b = rl_rows(straight), rl_rows(split)
    critic = [k for k in a[-1] if k.startswith("critic/")]
    assert critic and [[r[k] for k in critic] for r in a] == [[r[k] for k in critic] for r in b]
    wa, wb = load_file(straight / "policy" / "rl" / "model.safetensors"), load_file(split / "policy" / "rl" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
