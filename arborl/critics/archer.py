"""ArCHer's critic (Zhou et al. 2024): off-policy, turn-level, twin Q heads and a V head with target copies.

Where it sits: the heads read the policy's last-layer hidden states, detached (the same features
as Turn-PPO's ``head`` critic, :mod:`arborl.critics.features`): ``h_s`` at the last prompt token of
a turn (the state) and ``h_a`` at the turn's last generated token (the state and the action read
together). The reference code trains a separate RoBERTa encoder; here the policy is the encoder,
so the critic costs three small MLPs, never changes the policy, and its features follow the policy
as it trains (the replay's features are recomputed with the current policy at every step).

* ``Q_i(s, a) = MLP_i([h_s; h_a])`` for i = 1, 2, and ``V(s) = MLP(h_s)``.
* Targets ``Q̄_1, Q̄_2, V̄``: copies of the online heads, soft-updated after every critic step,
  ``θ̄ <- (1 - τ) θ̄ + τ θ`` (``rl.archer_tau``, 0.1 as in the paper's configs).
* TD (each critic step, ``rl.critic_epochs`` per iteration):

      Q_i(s, a) <- r + γ (1 - done) V̄(s')          on turns sampled from the replay buffer
      V(s)      <- min(Q̄_1, Q̄_2)(s, a)              on this iteration's turns (the current policy's actions)

  The paper regresses ``V`` on ``Q̄`` at an action freshly sampled from the current policy; the
  turns of this iteration are exactly such samples (the policy that wrote them has not been
  updated when they were rolled out), so no extra generation is needed. ``done`` is 1 after a
  terminated episode's last turn; after a truncated one (a turn or context budget) ``V̄`` is read at
  the episode's last token, as Turn-PPO bootstraps (the reference code counts the horizon as done).
* Replay buffer: the episode ids of the last ``rl.archer_replay_iters`` iterations, kept in the
  critic's state; turns are drawn uniformly with replacement (``rl.critic_minibatch`` a step) and
  read back from the trajectory store with ``store.slice`` (only the turns up to the next state).
* The actor's advantage is ``min(Q_1, Q_2)(s_h, a_h) - V(s_h)`` of the online heads
  (:func:`arborl.credit.archer`), fed to the existing token-level PPO update (the reference uses
  plain REINFORCE with no ratio or clip; PPO with ``ppo_epochs = 1`` and no KL is the closest).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

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


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * online``, parameter by parameter."""
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.mul_(1.0 - tau).add_(o, alpha=tau)


def td_targets(reward: Tensor, next_value: Tensor, done: Tensor, gamma: float) -> Tensor:
    """``r + gamma * (1 - done) * V̄(s')``, the regression target of both Q heads."""
    return reward + gamma * (1.0 - done.to(reward.dtype)) * next_value


class ArcherHeads(nn.Module):
    """Twin Q heads and a V head over hidden states of width ``width``."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        self.q1 = mlp_head(2 * width, width, seed=seed)
        self.q2 = mlp_head(2 * width, width, seed=seed + 1)
        self.v = mlp_head(width, width, seed=seed + 2)

    def q(self, h_s: Tensor, h_a: Tensor) -> tuple[Tensor, Tensor]:
        """``(Q_1, Q_2)`` of states ``h_s`` ``[M, H]`` and actions ``h_a`` ``[M, H]``."""
        x = torch.cat([h_s, h_a], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def value(self, h_s: Tensor) -> Tensor:
        """``V`` of states ``h_s``."""
        return self.v(h_s).squeeze(-1)


class ArcherCritic:
    """The :class:`~arborl.train.credit_models.CreditModel` of ``archer`` (see the module docstring).

    Args:
        cfg: The run's config (``rl.archer_tau``, ``rl.critic_lr``, ``rl.critic_epochs``, ...).
        policy: The start-of-RL policy (its hidden size).
        tok: Its tokenizer.
    """

    def __init__(self, cfg: TrainConfig, policy: nn.Module, tok) -> None:
        self.rc, self.pad_id = cfg.rl, pad_id_of(tok)
        self.online = ArcherHeads(policy.config.hidden_size, cfg.seed + 21)
        self.target = copy.deepcopy(self.online).requires_grad_(False)  # hard copy at the start (tau = 1)
        self.opt = torch.optim.AdamW(self.online.parameters(), lr=cfg.rl.critic_lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(cfg.seed + 22)
        self.replay: list[list[tuple[str, int]]] = []  # per iteration: (episode id, turns)

    def _turn_features(self, policy: nn.Module, paths) -> tuple[Tensor, Tensor, Tensor]:
        """``h_s`` and ``h_a`` of every turn of ``paths`` (concatenated), and ``h_end`` ``[E, H]`` of each path's last token."""
        pos = [turn_positions(p) for p in paths]
        with torch.no_grad():
            feats = hidden_at(trunk_of(policy), [p.ids for p in pos],
                              [[*p.state, *p.action, len(p.ids) - 1] for p in pos], pad_id=self.pad_id)
        h_s = [f[: len(p.state)] for f, p in zip(feats, pos, strict=True)]
        h_a = [f[len(p.state): 2 * len(p.state)] for f, p in zip(feats, pos, strict=True)]
        return torch.cat(h_s), torch.cat(h_a), torch.stack([f[-1] for f in feats])

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """``q_values`` (``min(Q_1, Q_2)``) and ``values`` ``[N]`` of the online heads, for :func:`arborl.credit.archer`."""
        h_s, h_a, _ = self._turn_features(ctx.policy, [ep.path() for ep in ctx.episodes])
        with torch.no_grad():
            q1, q2 = self.online.q(h_s, h_a)
            v = self.online.value(h_s)
        return {"q_values": torch.minimum(q1, q2), "values": v}

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """Add this iteration to the replay, then ``rl.critic_epochs`` TD steps with a soft target update after each."""
        rc = self.rc
        self.replay.append([(ctx.stored_id(ep.episode_id), len(ep.path())) for ep in ctx.episodes if ep.source == "rl"])
        self.replay = self.replay[-rc.archer_replay_iters:]
        h_s, h_a, _ = self._turn_features(ctx.policy, [ep.path() for ep in ctx.episodes])
        sums: dict[str, float] = {}
        for _ in range(rc.critic_epochs):
            s, a, r, s_next, done = self.sample(ctx)
            with torch.no_grad():
                y_q = td_targets(r, self.target.value(s_next), done, rc.gamma)
                y_v = torch.minimum(*self.target.q(h_s, h_a))
            q1, q2 = self.online.q(s, a)
            losses = {"q1": clipped_value_loss(q1, q1.detach(), y_q, clip=None),
                      "q2": clipped_value_loss(q2, q2.detach(), y_q, clip=None),
                      "v": clipped_value_loss(self.online.value(h_s), y_v, y_v, clip=None)}
            loss = sum(out.loss for out in losses.values())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.online.parameters(), rc.grad_clip)
            self.opt.step()
            soft_update(self.target, self.online, rc.archer_tau)
            for name, out in losses.items():
                sums[f"critic/{name}_loss"] = sums.get(f"critic/{name}_loss", 0.0) + out.terms["critic/loss"]
        metrics = {k: v / rc.critic_epochs for k, v in sums.items()}
        with torch.no_grad():
            metrics["critic/v_explained_var"] = explained_variance(self.online.value(h_s), y_v)
            metrics["critic/q_mean"] = float(torch.minimum(*self.online.q(h_s, h_a)).mean())
        metrics["critic/replay_turns"] = float(sum(n for it in self.replay for _, n in it))
        return metrics

    def sample(self, ctx: CreditContext) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``rl.critic_minibatch`` replay turns, uniformly with replacement, read from the store.

        Returns:
            ``(h_s, h_a, r, h_s', done)`` with the current policy's features.
        """
        turns = [(eid, k, n) for it in self.replay for eid, n in it for k in range(n)]
        picks = [turns[i] for i in torch.randint(0, len(turns), (self.rc.critic_minibatch,), generator=self.gen).tolist()]
        need: dict[str, int] = {}
        for eid, k, n in picks:  # read each sampled episode once, up to the turn after its latest sampled turn
            need[eid] = max(need.get(eid, 0), min(k + 2, n))
        ids = list(need)
        paths = [ctx.store.slice(eid, 0, need[eid]) for eid in ids]
        h_s, h_a, h_end = self._turn_features(ctx.policy, paths)
        where = {eid: (j, off) for j, (eid, off) in enumerate(zip(ids, offsets([need[e] for e in ids]), strict=True))}
        cut = {eid: bootstraps(ctx.store.index_row(eid).stop_reason) for eid in ids}
        rows, s_next, r, done = [], [], [], []
        for eid, k, n in picks:
            j, off = where[eid]
            rows.append(off + k)
            r.append(paths[j][k].reward)
            last = k + 1 == n
            s_next.append(h_end[j] if last else h_s[off + k + 1])
            done.append(last and not cut[eid])
        return (h_s[rows], h_a[rows], torch.tensor(r, dtype=torch.float32), torch.stack(s_next),
                torch.tensor(done, dtype=torch.bool))

    def state_dict(self) -> dict:
        """Online and target heads, optimizer, sampling RNG and the replay index."""
        return {"online": self.online.state_dict(), "target": self.target.state_dict(), "opt": self.opt.state_dict(),
                "gen": self.gen.get_state(), "replay": [list(it) for it in self.replay]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])
        self.replay = [[tuple(x) for x in it] for it in state["replay"]]


def build_archer_critic(cfg: TrainConfig, policy: nn.Module, tok) -> ArcherCritic:
    """The ``CREDIT_MODELS`` builder of ``archer``."""
    return ArcherCritic(cfg, policy, tok)
