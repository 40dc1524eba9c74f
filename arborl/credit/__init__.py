"""Credit assignment: pure functions from rewards and group structure to advantages.

All estimators share one input, :class:`StepBatch` (tensors only), and return one advantage
per step (turn); the trainer broadcasts a step's advantage to the trainable tokens of that turn.
Nothing here imports env, rollout or policy code.
"""

from arborl.credit.advantages import (
    best_return_weights,
    best_return_weights_reference,
    dense_ids,
    discounted_returns,
    grpo_advantages,
    grpo_advantages_reference,
    step_group_advantages,
    step_group_advantages_reference,
)
from arborl.credit.estimators import StepBatch, best_step, gigpo, grpo

__all__ = [
    "StepBatch",
    "best_return_weights",
    "best_return_weights_reference",
    "best_step",
    "dense_ids",
    "discounted_returns",
    "gigpo",
    "grpo",
    "grpo_advantages",
    "grpo_advantages_reference",
    "step_group_advantages",
    "step_group_advantages_reference",
]
