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
