"""Implicit process rewards: PRIME (cross-entropy on outcomes) and iStar (trajectory DPO).

The reward model ``pi_phi`` is a causal LM initialised from the start policy of RL. Its reward of a
generated token is ``r_t = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t))`` (PRIME's
``q_t`` times ``beta = rl.prm_beta``, 0.05 in both references), on every trained token of a turn
(the last one included: the verl recipe drops the last valid token, the original PRIME does not);
a turn's step reward is the sum over its tokens. The reference is

* ``frozen`` (PRIME, ``ref_type: freeze``): a frozen copy of the start policy;
* ``behaviour`` (iStar, ``ref_path = null``): the rollout policy, i.e. the behaviour log-probs
  stored with the episode.

Training, after the policy update, on the iteration's episodes sampled from the start state:

* ``objective = "ce"`` (PRIME ``loss_type ce``): ``BCE(sigmoid(beta * sum_t q_t), outcome)``, the
  sequence-level implicit reward against the 0/1 outcome.
* ``objective = "dpo"`` (iStar ``loss_type eto``): for every pair (better, worse) of one group,
  better meaning a higher episode score, ``-log sigmoid(Q_better - Q_worse)`` with ``Q_tau`` the mean
  (``rl.prm_pair_agg = "mean"``, iStar's code) or sum (``"sum"``, its paper) over the trajectory's
  turns of their step rewards. A group without a pair contributes nothing. The graph is kept:
  iStar's released ``update_rm_eto`` detaches ``q`` and never trains its reward model.

As in both references (``update: after``), the rewards an iteration's advantages use come from the
reward model before that iteration's reward-model step.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from arborl.config import ConfigError
from arborl.policy import token_logprobs
from arborl.prm.common import minibatches, outcome, step_sums, trainable_copy
from arborl.train.batch import TokenBatch, length_chunks
from arborl.train.config import TrainConfig
from arborl.train.credit_models import CreditContext

OBJECTIVES = ("ce", "dpo")
REFERENCES = ("frozen", "behaviour")


class ImplicitPRM:
    """An implicit process reward model as a credit model (``implicit_prm``: ce + frozen; ``istar``: dpo + behaviour).

    Args:
        cfg: The run's config (``rl.prm_*`` keys).
        policy: The start policy of RL (copied, and copied again as the frozen reference).
        tok: Its tokenizer (unused; the hook's signature).
        objective: ``ce`` (PRIME) or ``dpo`` (iStar).
        reference: ``frozen`` (a copy of the start policy) or ``behaviour`` (the stored rollout log-probs).
    """

    def __init__(self, cfg: TrainConfig, policy: torch.nn.Module, tok, *, objective: str = "ce",
                 reference: str = "frozen") -> None:
        if objective not in OBJECTIVES or reference not in REFERENCES:
            raise ConfigError(f"implicit PRM objective {objective!r} / reference {reference!r} is unknown; "
                              f"choose from {OBJECTIVES} / {REFERENCES}")
        rc = cfg.rl
        self.cfg, self.objective, self.reference = cfg, objective, reference
        self.beta, self.temperature = rc.prm_beta, cfg.rollout.sampling.logprob_temperature
        self.model = trainable_copy(policy)
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if reference == "frozen" else None
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=rc.prm_lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(cfg.seed + 13)
        self.last_scores: dict[str, float] = {}

    def log_ratio(self, batch: TokenBatch) -> Tensor:
        """``[B, T]`` ``log pi_phi - log pi_ref`` on the trained tokens (0 elsewhere), with gradients to ``pi_phi``."""
        logp = token_logprobs(self.model, batch.input_ids, batch.attention_mask, temperature=self.temperature)
        if self.ref is None:
            ref = batch.old_logp
        else:
            with torch.no_grad():
                ref = token_logprobs(self.ref, batch.input_ids, batch.attention_mask, temperature=self.temperature)
        return (logp - ref) * batch.loss_mask

    @torch.no_grad()
    def token_rewards(self, batch: TokenBatch) -> Tensor:
        """``[B, T]`` implicit process reward ``beta * (log pi_phi - log pi_ref)`` of every trained token."""
        out = torch.zeros_like(batch.loss_mask)
        for rows in length_chunks(batch, self.cfg.rl.prm_minibatch_size):
            sub = batch.select(rows)
            out[rows, : sub.input_ids.shape[1]] = self.beta * self.log_ratio(sub)
        return out

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """``{"step_scores": [N]}``: each turn's summed token rewards."""
        scores = step_sums(self.token_rewards(ctx.batch), ctx.batch.step_of_token, ctx.steps.episode.numel())
        active = scores[ctx.steps.step_active()]
        self.last_scores = {"prm/step_reward_mean": float(active.mean()) if active.numel() else 0.0,
                            "prm/step_reward_abs": float(active.abs().mean()) if active.numel() else 0.0}
        return {"step_scores": scores}

    def trajectory_rewards(self, batch: TokenBatch, steps, rows: Tensor) -> Tensor:
        """``[len(rows)]`` sequence-level implicit reward of episodes ``rows`` (batch rows = episode ids).

        ``ce``: ``beta * sum_t q_t``; ``dpo``: the mean or sum (``rl.prm_pair_agg``) of the turns' rewards.
        """
        sub = batch.select(rows)
        per_token = self.beta * self.log_ratio(sub)
        total = per_token.sum(-1)
        if self.objective == "ce" or self.cfg.rl.prm_pair_agg == "sum":
            return total
        turns = torch.bincount(steps.episode, minlength=batch.input_ids.shape[0])[rows].clamp_min(1)
        return total / turns.to(total.dtype)

    def ce_loss(self, batch: TokenBatch, steps, rows: Tensor, outcomes: Tensor) -> Tensor:
        """PRIME: ``BCE(sigmoid(beta * sum q), outcome)`` over episodes ``rows``."""
        return torch.nn.functional.binary_cross_entropy_with_logits(self.trajectory_rewards(batch, steps, rows),
                                                                    outcomes[rows])

    def dpo_loss(self, batch: TokenBatch, steps, rows: Tensor) -> tuple[Tensor | None, int]:
        """iStar: mean over (better, worse) pairs within a group of ``-log sigmoid(Q_better - Q_worse)``.

        Returns:
            The loss (``None`` without a pair) and the number of pairs.
        """
        group, score = steps.group[rows], steps.score[rows]
        better = (group[:, None] == group[None, :]) & (score[:, None] > score[None, :])
        pairs = better.nonzero()
        if not pairs.numel():
            return None, 0
        q = self.trajectory_rewards(batch, steps, rows)
        return torch.nn.functional.softplus(-(q[pairs[:, 0]] - q[pairs[:, 1]])).mean(), int(pairs.shape[0])

    def _chunks(self, ctx: CreditContext) -> list[Tensor]:
        """Rows of the sampled episodes: similar-length minibatches (ce) or whole groups together (dpo)."""
        steps = ctx.steps
        sampled = steps.sampled if steps.sampled is not None else torch.ones_like(steps.group, dtype=torch.bool)
        rows = sampled.nonzero()[:, 0]
        if self.objective == "ce":
            return [rows[c] for c in minibatches(ctx.batch.select(rows), self.cfg.rl.prm_minibatch_size, self.gen)]
        chunks, current = [], []
        for g in torch.unique(steps.group[rows])[torch.randperm(torch.unique(steps.group[rows]).numel(),
                                                                 generator=self.gen)].tolist():
            current += rows[steps.group[rows] == g].tolist()
            if len(current) >= self.cfg.rl.prm_minibatch_size:
                chunks.append(torch.tensor(current))
                current = []
        return chunks + ([torch.tensor(current)] if current else [])

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """``rl.prm_epochs`` passes of the objective over this iteration's sampled episodes."""
        rc = self.cfg.rl
        outcomes = torch.tensor([outcome(ep.rewards.get(rc.score_key)) for ep in ctx.episodes])
        losses, n_pairs = [], 0
        for _ in range(rc.prm_epochs):
            for rows in self._chunks(ctx):
                if self.objective == "ce":
                    loss, pairs = self.ce_loss(ctx.batch, ctx.steps, rows, outcomes), 0
                else:
                    loss, pairs = self.dpo_loss(ctx.batch, ctx.steps, rows)
                n_pairs += pairs
                if loss is None:
                    continue
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), rc.grad_clip)
                self.opt.step()
                losses.append(float(loss.detach()))
        metrics = {**self.last_scores, "prm/loss": sum(losses) / max(len(losses), 1), "prm/updates": float(len(losses))}
        if self.objective == "dpo":
            metrics["prm/pairs"] = n_pairs / rc.prm_epochs
        return metrics

    def state_dict(self) -> dict:
        """The reward model's (and the frozen reference's) weights and the optimizer state."""
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "gen": self.gen.get_state(),
                "ref": None if self.ref is None else self.ref.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["gen"])
        if self.ref is not None and state.get("ref") is not None:
            self.ref.load_state_dict(state["ref"])
