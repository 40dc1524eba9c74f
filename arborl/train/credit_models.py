"""The credit-model hook: how methods that need a trained model plug into the RL loop.

A credit model (a turn-level critic, a process reward model) is built once per RL run from the
start policy, hands the credit estimator extra tensors every iteration (:meth:`CreditModel.step_inputs`,
called before credit) and trains on the iteration's data after the policy update
(:meth:`CreditModel.fit`). Its state is saved in and restored from ``trainer_state.pt``. The
estimators stay pure functions in :mod:`arborl.credit`; the models live outside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from arborl.credit import StepBatch
from arborl.train.batch import TokenBatch
from arborl.train.config import TrainConfig
from arborl.trajectory import Episode


@dataclass
class CreditContext:
    """What one RL iteration hands a credit model."""

    cfg: TrainConfig
    iteration: int
    episodes: list[Episode]     # this iteration's episodes, as the store returned them
    steps: StepBatch            # their flat steps (arborl.train.batch.step_batch)
    batch: TokenBatch           # their collated tokens (arborl.train.batch.collate)
    policy: torch.nn.Module     # the current policy (read it; do not step its optimizer)
    tok: Any
    store: Any                  # the run's trajectory store (replay buffers and MC targets read it)


class CreditModel(Protocol):
    """A model trained beside the policy that supplies the credit estimator's extra inputs."""

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """Extra tensors for the estimator, passed as keyword arguments, e.g. {"values": [N]}
        (one entry per step row of ctx.steps) or {"step_scores": [N]}. Called before credit.
        """
        ...

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """Train on this iteration's data (after the policy update); return metrics with a
        prefix of its own, e.g. {"critic/loss": ..., "critic/explained_var": ...}.
        """
        ...

    def state_dict(self) -> dict:
        """Everything needed to continue training (weights, optimizer state)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...
