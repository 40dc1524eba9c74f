"""The credit menu as config: every choice loads, binds to its estimator, and bad combinations are refused."""

import pytest
import torch

from arborl.cli import CREDIT_ESTIMATORS, credit_from_config
from arborl.config import ConfigError, load_config
from arborl.credit import StepBatch
from arborl.train.config import RLConfig, TrainConfig


def test_every_credit_literal_has_a_registry_entry_and_back():
    import typing

    choices = set(typing.get_args(typing.get_type_hints(RLConfig)["credit"]))
    assert choices == set(CREDIT_ESTIMATORS) and {"rloo", "dr_grpo"} <= choices


@pytest.mark.parametrize("singleton,lone", [("raw", 0.7), ("zero", 0.0)])
@pytest.mark.parametrize("credit", ["grpo", "rloo", "dr_grpo", "gigpo"])
def test_singleton_option_reaches_each_group_estimator(credit, singleton, lone):
    cfg = load_config(TrainConfig, None, [f"rl.credit={credit}", f"rl.singleton={singleton}", "rl.norm_by_std=false"])
    fn = credit_from_config(cfg.rl)
    b = StepBatch(episode=torch.tensor([0, 1, 2]), step=torch.zeros(3, dtype=torch.long), reward=torch.zeros(3),
                  anchor=torch.arange(3), group=torch.tensor([0, 1, 1]), score=torch.tensor([0.7, 1.0, 0.0]))
    out = fn(b)
    assert out[0].item() == pytest.approx(lone)
    # the pair: R - mean (grpo without std, dr_grpo, gigpo) or R - other (rloo)
    assert out[1].item() == pytest.approx(1.0 if credit == "rloo" else 0.5)


def test_dr_grpo_ignores_norm_by_std_and_length_neutral():
    cfg = load_config(TrainConfig, None, ["rl.credit=dr_grpo", "rl.norm_by_std=true", "rl.length_neutral=true"])
    b = StepBatch(episode=torch.tensor([0, 0, 0, 1]), step=torch.tensor([0, 1, 2, 0]), reward=torch.zeros(4),
                  anchor=torch.arange(4), group=torch.tensor([0, 0]), score=torch.tensor([0.0, 1.0]))
    assert credit_from_config(cfg.rl)(b).tolist() == [-0.5, -0.5, -0.5, 0.5]


@pytest.mark.parametrize("overrides,needle", [
    (["rl.keep_ratio=0"], "rl.keep_ratio is 0"),
    (["rl.keep_ratio=1.5"], "keep a fraction of the groups in (0, 1]"),
    (["rl.credit=dr_grpo", "rl.loss_agg=seq-mean-token-mean"], "use token-mean or seq-mean-token-sum-norm"),
    (["rl.singleton=none"], "rl.singleton: 'none' is not one of"),
    (["rl.filter=dapo"], "rl.filter: 'dapo' is not one of"),
])
def test_bad_credit_settings_name_the_key_and_the_fix(overrides, needle):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(TrainConfig, None, overrides)
    assert needle in str(err.value)


def test_starpo_s_with_its_stabilisers_loads():
    cfg = load_config(TrainConfig, "examples/frozenlake.toml",
                      ["rl.filter=starpo_s", "rl.keep_ratio=0.5", "rl.kl_coef=0", "rl.clip_low=0.2", "rl.clip_high=0.28"])
    assert (cfg.rl.filter, cfg.rl.keep_ratio, cfg.rl.kl_coef, cfg.rl.clip_high) == ("starpo_s", 0.5, 0.0, 0.28)


@pytest.mark.parametrize("credit,setting,expected", [
    ("prm", "auto", "group"), ("implicit_prm", "auto", "rloo"), ("istar", "auto", "rloo"),
    ("prm", "rloo", "rloo"), ("implicit_prm", "group", "group"), ("istar", "previous", "previous"),
])
def test_prm_baseline_auto_is_group_for_the_explicit_prm_and_rloo_for_the_implicit_ones(credit, setting, expected):
    cfg = load_config(TrainConfig, None, [f"rl.credit={credit}", f"rl.prm_baseline={setting}"])
    assert credit_from_config(cfg.rl).keywords["baseline"] == expected


@pytest.mark.parametrize("credit", ["prm", "implicit_prm", "istar"])
@pytest.mark.parametrize("norm", ["true", "false"])
def test_prm_step_norm_is_off_by_default_and_independent_of_norm_by_std(credit, norm):
    default = load_config(TrainConfig, None, [f"rl.credit={credit}", f"rl.norm_by_std={norm}"])
    assert credit_from_config(default.rl).keywords["step_norm_by_std"] is False
    on = load_config(TrainConfig, None, [f"rl.credit={credit}", "rl.prm_step_norm=std", f"rl.norm_by_std={norm}"])
    assert credit_from_config(on.rl).keywords["step_norm_by_std"] is True


def test_prm_step_norm_rejects_an_unknown_setting_by_name():
    with pytest.raises(ConfigError, match="prm_step_norm"):
        load_config(TrainConfig, None, ["rl.prm_step_norm=auto"])


@pytest.mark.parametrize("credit", ["prm", "implicit_prm", "istar"])
def test_anchor_weight_reaches_the_process_estimator_with_the_env_discount(credit):
    off = load_config(TrainConfig, None, [f"rl.credit={credit}"])
    assert credit_from_config(off.rl).keywords["anchor_weight"] == 0.0
    on = load_config(TrainConfig, None, [f"rl.credit={credit}", "rl.anchor_weight=1.5", "rl.gamma=0.8"])
    assert credit_from_config(on.rl).keywords.items() >= {"anchor_weight": 1.5, "anchor_gamma": 0.8}.items()
