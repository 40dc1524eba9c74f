"""Losses: pure tensor functions (policy gradient, KL, entropy, SFT) and their aggregation."""

from arborl.loss.policy import (
    AGG_MODES,
    KL_KINDS,
    LossOutput,
    aggregate,
    kl_estimate,
    ppo_clip_loss,
    sft_loss,
)
from arborl.loss.value import clipped_value_loss, explained_variance

__all__ = ["AGG_MODES", "KL_KINDS", "LossOutput", "aggregate", "clipped_value_loss", "explained_variance", "kl_estimate",
           "ppo_clip_loss", "sft_loss"]
