"""Turn-PPO's critic: ``V(s_h)`` once per turn, fitted to turn-level GAE targets with a clipped value loss.

Two kinds (``rl.critic``):

* ``head`` (default): an MLP on the policy's last-layer hidden state at the last prompt token of
  each turn. The hidden state is read without gradient (detached): the critic never changes the
  policy, so the policy update is exactly the one the advantages ask for, and the critic costs
  one forward pass of the policy per iteration (its features are computed once, before credit,
  and reused for the fit). Training the trunk as well would need the value loss inside the policy
  update (a shared optimizer, a loss weight), which changes the policy's own update; not offered.
* ``separate``: a copy of the policy's transformer body (same architecture and, at the start of
  RL, the same weights: the policy's config is the critic's config) with its own head, trained
  end to end with its own optimizer. Twice the compute and memory of the policy's body, and
  features that follow the critic's own objective.

Both train with AdamW at ``rl.critic_lr`` for ``rl.critic_epochs`` passes over the iteration's
episodes in minibatches of ``rl.critic_minibatch`` episodes, on the targets ``G_h = A_h + V_old``
of :func:`arborl.credit.turn_gae_returns` (computed over every episode, the filtered-out groups
too: the critic learns from all the data).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from arborl.credit import turn_gae_returns
from arborl.critics.features import (
    bootstraps,
    hidden_at,
    mlp_head,
    offsets,
    pad_id_of,
    trunk_of,
    turn_positions,
)
from arborl.loss import clipped_value_loss, explained_variance
from arborl.train.config import TrainConfig
from arborl.train.credit_models import CreditContext


class TurnCritic:
    """A turn-level value function ``V(s_h)``: the :class:`~arborl.train.credit_models.CreditModel` of ``turn_ppo``.

    Args:
        cfg: The run's config (``rl.critic``, ``rl.critic_lr``, ``rl.critic_epochs``, ...).
        policy: The start-of-RL policy: its hidden size, and for ``separate`` its body to copy.
        tok: Its tokenizer.
    """

    def __init__(self, cfg: TrainConfig, policy: torch.nn.Module, tok) -> None:
        rc = cfg.rl
        self.rc, self.pad_id = rc, pad_id_of(tok)
        width = policy.config.hidden_size
        self.head = mlp_head(width, width, seed=cfg.seed + 11)
        self.trunk = copy.deepcopy(trunk_of(policy)).requires_grad_(True) if rc.critic == "separate" else None
        params = list(self.head.parameters()) + ([] if self.trunk is None else list(self.trunk.parameters()))
        self.opt = torch.optim.AdamW(params, lr=rc.critic_lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(cfg.seed + 12)
        self._cache: dict[str, Tensor] = {}

    def _features(self, ctx: CreditContext, episodes, *, grad: bool) -> Tensor:
        """``[sum of turns + E, H]``: each episode's turn states, then its final state (rows per episode)."""
        trunk = self.trunk if self.trunk is not None else trunk_of(ctx.policy)
        paths = [turn_positions(ep.path()) for ep in episodes]
        with torch.set_grad_enabled(grad):
            feats = hidden_at(trunk, [p.ids for p in paths], [[*p.state, len(p.ids) - 1] for p in paths],
                              pad_id=self.pad_id)
        return torch.cat(feats) if feats else torch.zeros(0, self.head[0].in_features)

    def _split(self, ctx: CreditContext, feats: Tensor) -> tuple[Tensor, Tensor]:
        """Row indices of the turn states (``[N]``) and of the final states (``[E]``) in ``_features``."""
        turns = [len(ep.path()) for ep in ctx.episodes]
        starts = offsets([t + 1 for t in turns])
        state_rows = [s + k for s, t in zip(starts, turns, strict=True) for k in range(t)]
        final_rows = [s + t for s, t in zip(starts, turns, strict=True)]
        return torch.tensor(state_rows, dtype=torch.long), torch.tensor(final_rows, dtype=torch.long)

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """``values`` ``[N]``, ``episode_next_value`` ``[E]`` and ``episode_truncated`` ``[E]`` for :func:`arborl.credit.turn_gae`."""
        with torch.no_grad():
            feats = self._features(ctx, ctx.episodes, grad=False)
            v = self.head(feats).squeeze(-1)
        state_rows, final_rows = self._split(ctx, feats)
        if state_rows.numel() != ctx.steps.episode.numel():
            raise ValueError(f"the critic found {state_rows.numel()} turns, the step batch has {ctx.steps.episode.numel()}")
        truncated = torch.tensor([bootstraps(ep.stop_reason) for ep in ctx.episodes], dtype=torch.bool)
        self._cache = {"feats": feats, "values": v[state_rows], "next": v[final_rows], "truncated": truncated,
                       "state_rows": state_rows}
        return {"values": v[state_rows], "episode_next_value": v[final_rows], "episode_truncated": truncated}

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """``rl.critic_epochs`` passes of clipped value-loss steps towards this iteration's GAE targets."""
        c, rc = self._cache, self.rc
        _, returns = turn_gae_returns(ctx.steps, values=c["values"], episode_next_value=c["next"],
                                      episode_truncated=c["truncated"], gamma=rc.gamma, lam=rc.gae_lambda)
        episode = ctx.steps.episode
        sums: dict[str, float] = {}
        n = 0
        for _ in range(rc.critic_epochs):
            order = torch.randperm(len(ctx.episodes), generator=self.gen)
            for mb in order.split(rc.critic_minibatch):
                rows = torch.isin(episode, mb).nonzero()[:, 0]
                out = clipped_value_loss(self._values(ctx, mb, rows), c["values"][rows], returns[rows],
                                         clip=rc.value_clip or None)
                self.opt.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], rc.grad_clip)
                self.opt.step()
                for k, val in out.terms.items():
                    sums[k] = sums.get(k, 0.0) + val
                n += 1
        metrics = {k: v / max(n, 1) for k, v in sums.items()}
        metrics["critic/explained_var"] = explained_variance(c["values"], returns)
        metrics["critic/value_mean"] = float(c["values"].mean()) if c["values"].numel() else 0.0
        metrics["critic/return_mean"] = float(returns.mean()) if returns.numel() else 0.0
        return metrics

    def _values(self, ctx: CreditContext, mb: Tensor, rows: Tensor) -> Tensor:
        """Current values of the turn rows ``rows`` (the turns of episodes ``mb``), with grad for the head (and trunk)."""
        if self.trunk is None:  # the cached policy features are fixed: only the head learns
            return self.head(self._cache["feats"][self._cache["state_rows"][rows]]).squeeze(-1)
        eps = sorted(mb.tolist())
        feats = self._features(ctx, [ctx.episodes[e] for e in eps], grad=True)
        keep = torch.cat([torch.arange(len(ctx.episodes[e].path())) + off for e, off in
                          zip(eps, offsets([len(ctx.episodes[e].path()) + 1 for e in eps]), strict=True)])
        return self.head(feats[keep]).squeeze(-1)

    def state_dict(self) -> dict:
        """Head (and body) weights, optimizer, minibatch RNG."""
        return {"head": self.head.state_dict(), "trunk": None if self.trunk is None else self.trunk.state_dict(),
                "opt": self.opt.state_dict(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.head.load_state_dict(state["head"])
        if self.trunk is not None:
            self.trunk.load_state_dict(state["trunk"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])


def build_turn_critic(cfg: TrainConfig, policy: torch.nn.Module, tok) -> TurnCritic:
    """The ``CREDIT_MODELS`` builder of ``turn_ppo``."""
    return TurnCritic(cfg, policy, tok)
