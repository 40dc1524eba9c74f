"""The credit-model hook: methods whose advantages need a trained model plug into the RL loop here.

A credit model (Turn-PPO's critic, ArCHer's Q/V, a process reward model) is built by the
registry ``arborl.cli.CREDIT_MODELS`` under the same name as its ``rl.credit`` estimator and
handed to :func:`arborl.train.rl.train_rl`. Each iteration the loop calls, in order:

1. :meth:`CreditModel.step_inputs` before credit: extra tensors for the estimator, passed to it
   as keyword arguments (``[N]`` per step row, or ``[E]`` per episode when the key starts with
   ``episode_``; see :func:`arborl.credit.credit_on_groups`);
2. the policy update;
3. :meth:`CreditModel.fit` on the iteration's data: its metrics join the iteration's row.

The model's :meth:`~CreditModel.state_dict` is saved in every checkpoint's ``trainer_state.pt``
and restored on ``--resume``, so a resumed run continues exactly.
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
    """What one RL iteration hands a credit model.

    Attributes:
        cfg: The run's config.
        iteration: The iteration (0-based).
        episodes: This iteration's episodes, as the store returned them.
        steps: Their flat steps (:func:`arborl.train.batch.step_batch`).
        batch: Their collated tokens (:func:`arborl.train.batch.collate`).
        policy: The current policy (read it; do not step its optimizer).
        tok: The policy's tokenizer.
        store: The run's trajectory store (replay buffers and Monte-Carlo targets read it).
    """

    cfg: TrainConfig
    iteration: int
    episodes: list[Episode]
    steps: StepBatch
    batch: TokenBatch
    policy: torch.nn.Module
    tok: Any
    store: Any

    def stored_id(self, episode_id: str) -> str:
        """The id under which the store holds this iteration's episode ``episode_id``.

        Identical episodes are stored once, so a duplicate's own id names nothing in the store; a
        model that keeps ids to read back later (a replay buffer) keeps this one.
        """
        resolve = getattr(self.store, "stored_id", None)  # the background writer's reader; a plain store's ids are stored ones
        return resolve(episode_id) if resolve is not None else episode_id


class CreditModel(Protocol):
    """A model that an estimator needs, trained by the RL loop alongside the policy."""

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """Extra tensors for the estimator (e.g. ``{"values": [N]}``), called before credit."""
        ...

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """Train on this iteration's data (after the policy update); metrics with the model's own prefix."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (weights, optimizer, RNG, buffers)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...
