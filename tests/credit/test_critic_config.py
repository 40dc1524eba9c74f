"""The critic-based credit choices as config: registry entries, options reaching the estimator, bad values refused."""

import pytest
import torch

from arborl.cli import CREDIT_ESTIMATORS, CREDIT_MODELS, credit_from_config, credit_model_from_config
from arborl.config import ConfigError, load_config
from arborl.credit import StepBatch
from arborl.train.config import TrainConfig


def test_every_credit_model_has_an_estimator_of_the_same_name():
    assert set(CREDIT_MODELS) <= set(CREDIT_ESTIMATORS) and {"turn_ppo", "archer"} <= set(CREDIT_MODELS)
    assert credit_model_from_config(load_config(TrainConfig, None, ["rl.credit=grpo"]).rl) is None


def test_turn_ppo_options_reach_the_estimator():
    # one episode, rewards (0, 1), V = 0: gamma 0.5, lambda 0 gives the TD errors (0.5 * 0 + 0, 1)
    cfg = load_config(TrainConfig, None, ["rl.credit=turn_ppo", "rl.gamma=0.5", "rl.gae_lambda=0",
                                          "rl.whiten_advantages=false"])
    b = StepBatch(episode=torch.tensor([0, 0]), step=torch.tensor([0, 1]), reward=torch.tensor([0.0, 1.0]),
                  anchor=torch.arange(2), group=torch.tensor([0]), score=torch.zeros(1))
    out = credit_from_config(cfg.rl)(b, values=torch.zeros(2), episode_next_value=torch.zeros(1),
                                     episode_truncated=torch.tensor([False]))
    assert out.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("override,needle", [
    ("rl.gae_lambda=1.5", "rl.gae_lambda"),
    ("rl.archer_tau=0", "rl.archer_tau"),
    ("rl.critic_lr=0", "rl.critic_lr"),
    ("rl.critic_epochs=0", "rl.critic_epochs"),
    ("rl.critic_warmup=-1", "rl.critic_warmup"),
    ("rl.value_clip=-0.1", "rl.value_clip"),
    ('rl.critic="big"', "rl.critic"),
])
def test_bad_critic_settings_are_refused_with_the_key_named(override, needle):
    with pytest.raises((ConfigError, ValueError), match=needle.replace(".", r"\.")):
        load_config(TrainConfig, None, ["rl.credit=turn_ppo", override])
