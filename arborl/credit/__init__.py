"""Credit assignment: pure functions from rewards and group structure to advantages.

All estimators share one input, :class:`StepBatch` (tensors only), and return one advantage
per step (turn); the trainer broadcasts a step's advantage to the trainable tokens of that turn.
Filters (:mod:`arborl.credit.filters`) pick the groups to train on before the estimator runs.
Every estimator has a slow loop beside it (:mod:`arborl.credit.reference`).
Nothing here imports env, rollout or policy code.
"""

from arborl.credit.advantages import (
    SINGLETON_RULES,
    best_return_weights,
    best_return_weights_reference,
    dense_ids,
    discounted_returns,
    grpo_advantages,
    grpo_advantages_reference,
    rloo_advantages,
    rloo_advantages_reference,
    step_group_advantages,
    step_group_advantages_reference,
)
from arborl.credit.estimators import StepBatch, anchor_step_advantages, best_step, dr_grpo, gigpo, grpo, rloo
from arborl.credit.filters import (
    credit_on_groups,
    group_score_std,
    starpo_s_groups,
    starpo_s_groups_reference,
)
from arborl.credit.gae import archer, turn_gae, turn_gae_returns, whiten_by_episode
from arborl.credit.process import process, process_step_advantages
from arborl.credit.tree import tree, tree_advantages, tree_reference, tree_values

__all__ = [
    "SINGLETON_RULES",
    "StepBatch",
    "anchor_step_advantages",
    "archer",
    "best_return_weights",
    "best_return_weights_reference",
    "best_step",
    "credit_on_groups",
    "dense_ids",
    "discounted_returns",
    "dr_grpo",
    "gigpo",
    "grpo",
    "grpo_advantages",
    "grpo_advantages_reference",
    "process",
    "process_step_advantages",
    "group_score_std",
    "rloo",
    "rloo_advantages",
    "rloo_advantages_reference",
    "starpo_s_groups",
    "starpo_s_groups_reference",
    "step_group_advantages",
    "step_group_advantages_reference",
    "turn_gae",
    "turn_gae_returns",
    "whiten_by_episode",
    "tree",
    "tree_advantages",
    "tree_reference",
    "tree_values",
]
