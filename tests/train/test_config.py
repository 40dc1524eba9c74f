"""Config layer: TOML + dotted overrides build the frozen dataclass tree; bad input names key and fix."""

import pytest

from arborl.config import ConfigError, load_config
from arborl.train.config import TrainConfig


def test_example_config_loads_with_overrides():
    cfg = load_config(TrainConfig, "examples/frozenlake.toml", ["rl.lr=1e-4", "env.kwargs.size=5", 'stages=["sft"]'])
    assert cfg.rl.lr == 1e-4 and cfg.env.kwargs["size"] == 5 and cfg.stages == ["sft"]
    assert cfg.policy.model.hidden_size == 256


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'rl\.learning_rate'|rl\.lr"):
        load_config(TrainConfig, None, ["rl.learning_rate=1e-3"])
    with pytest.raises(ConfigError, match="did you mean rl.ppo_epochs"):
        load_config(TrainConfig, None, ["rl.ppo_epoch=3"])


def test_wrong_type_names_key_and_expected_type():
    with pytest.raises(ConfigError, match=r"rl\.iterations: expected an integer, got 'many'"):
        load_config(TrainConfig, None, ["rl.iterations=many"])
    with pytest.raises(ConfigError, match=r"rl\.credit: 'ppo' is not one of"):
        load_config(TrainConfig, None, ["rl.credit=ppo"])


def test_invalid_value_and_missing_file():
    with pytest.raises(ConfigError, match="iterations must be > 0"):
        load_config(TrainConfig, None, ["rl.iterations=0"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(TrainConfig, "nope.toml")
    with pytest.raises(ConfigError, match="stages"):
        load_config(TrainConfig, None, ['stages=["fly"]'])


def test_every_leaf_config_field_has_help_text():
    from arborl.config import config_keys

    keys = config_keys(TrainConfig)
    assert len(keys) > 60 and {"rl.lr", "rl.clip_low", "rl.kl_kind", "rl.loss_agg", "env.kwargs"} <= {k.key for k in keys}
    missing = [k.key for k in keys if not k.help.strip()]
    assert missing == [], f"document these fields (attribute docstring under the field): {missing}"


def test_config_keys_report_defaults_and_resolved_values():
    from arborl.config import config_keys

    cfg = load_config(TrainConfig, "examples/frozenlake.toml", ["rl.lr=1e-4"])
    by_key = {k.key: k for k in config_keys(cfg)}
    assert by_key["rl.lr"].value == 1e-4 and by_key["rl.lr"].default == 3e-4
    assert by_key["policy.model.hidden_size"].value == 256 and by_key["rl.kl_kind"].type.startswith("Literal")


@pytest.mark.parametrize("overrides,needle", [
    (["rl.branch=true", "rollout.sampling.temperature=0.7"], "rollout.sampling.temperature = 1 or rl.branch_greedy = false"),
    (["rl.clip_c=0.5"], "dual-clip constant must be > 1"),
    (["rl.gamma=1.5"], "discount in [0, 1]"),
    (["rl.checkpoint_keep=0"], "checkpoint_keep must be > 0"),
    (['rl.credit="tree"'], "rl.credit = tree needs a rollout tree; set rl.tree = true"),
    (["rl.tree=true", "rl.tree_k=0"], "tree_k must be > 0"),
    (['rl.credit="grpo"', "rl.anchor_weight=1"], "use rl.credit = gigpo (its weight is rl.step_weight) or one of prm"),
    (["rl.branch=true", "rl.branch_states=-1"], "rl.branch_states is -1; use 0 (every visited state)"),
    (["rl.tree=true", 'rl.tree_select="max"'], "tree_select"),
    (['report_to=["comet"]'], "report_to: ['comet'] are unknown"),
])
def test_cross_field_rules_fail_at_load_time_with_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, overrides)
    assert needle in str(e.value)
