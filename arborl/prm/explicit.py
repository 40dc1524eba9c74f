"""Explicit process reward model, AgentPRM-style: a step scorer trained on Monte-Carlo targets.

**Targets** (:func:`mc_targets`; AgentPRM's ``compute_prm_target.py``, one departure). An episode
with 0/1 outcome ``s`` has ``o = 2s - 1``; its step ``t`` of ``T`` contributes ``gamma^(T-1-t) * o``
to the running mean ``Q(prefix)`` of every episode that went through the same *state prefix*: the
same task and seed and the same (state, action) pairs up to and including step ``t``. When several
stored episodes share a prefix, its target is their count-weighted mean (the discounted success
rate of the episodes through it). The label is ``(Q + 1) / 2`` in [0, 1]. AgentPRM discounts by
``gamma^t`` (steps from the *start*), which gives early steps the least discount; arborl discounts
by the steps to the end, so a step far from the outcome is the least certain.

**Named dimensions** (:data:`DIMENSIONS`). The scorer has one logit per configured dimension
(``rl.prm_dimensions``), each a separate named step reward. A dimension's target is a function
``fn(turns, k, label) -> float | None`` of the stored main path, the step index and the Monte-Carlo
label (``None``: this step has no label for that dimension, e.g. ``query_quality`` of a turn that
made no tool call). ``progress`` is the label itself (FrozenLake, Sokoban); the tool-agent ones are
``tool_choice``, ``query_quality`` and ``use_of_information``. A dotted ``module:function`` in
``rl.prm_dimensions`` adds one of your own.

**Model.** The start policy's transformer, copied (so it reads the policy's tokens and starts from
what SFT learnt), with a linear head (zero-initialised: every score starts at 0.5) on the hidden
state of the last token of each turn. A causal model's hidden state there has read exactly the
history up to and including the turn's action, so one forward pass per episode scores all its
steps. Trained with ``BCEWithLogits`` on the soft labels, AdamW at ``rl.prm_lr``.

**Training data** comes from the store (``query(source="rl", min_iteration=...)``): the policy's
own episodes of the last ``rl.prm_window`` iterations, at most ``rl.prm_buffer`` of them, newest
first. The step score handed to the estimator is the mean of the dimensions' probabilities.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from arborl.config import ConfigError
from arborl.policy.tail import hidden_rows
from arborl.prm.common import last_token_of_steps, minibatches, outcome, trainable_copy
from arborl.train.batch import TokenBatch, collate, length_chunks
from arborl.train.config import TrainConfig
from arborl.train.credit_models import CreditContext
from arborl.trajectory import Episode
from arborl.trajectory.schema import Turn

Dimension = Callable[[list[Turn], int, float], "float | None"]

_WORD = re.compile(r"[a-z0-9]{4,}")


def progress(turns: list[Turn], k: int, label: float) -> float | None:
    """How much the step moved the episode towards success: the Monte-Carlo label itself."""
    return label


def tool_choice(turns: list[Turn], k: int, label: float) -> float | None:
    """Whether calling this tool here was a good choice: the label for a valid tool call, 0 for an invalid turn."""
    t = turns[k]
    if not t.valid:
        return 0.0
    return label if t.tool_call is not None else None


def query_quality(turns: list[Turn], k: int, label: float) -> float | None:
    """Whether a query found something: 0 when the call failed or returned nothing, else the label."""
    t = turns[k]
    if t.tool_call is None or not any(isinstance(v, str) for v in t.tool_call.arguments.values()):
        return None
    return 0.0 if t.error or not (t.result or "").strip() else label


def use_of_information(turns: list[Turn], k: int, label: float) -> float | None:
    """Whether the step used what the last tool returned: the label if it repeats a word (4+ letters) of it, else 0."""
    prior = [t.result for t in turns[:k] if t.tool_call is not None and t.result]
    if not prior:
        return None
    seen = set(_WORD.findall(prior[-1].lower()))
    return label if seen & set(_WORD.findall(turns[k].action_text.lower())) else 0.0


DIMENSIONS: dict[str, Dimension] = {
    "progress": progress,
    "tool_choice": tool_choice,
    "query_quality": query_quality,
    "use_of_information": use_of_information,
}
"""The named dimensions ``rl.prm_dimensions`` may list, and their target functions."""


def resolve_dimensions(names: Sequence[str]) -> dict[str, Dimension]:
    """Name -> target function, for registered names and ``module:function`` paths."""
    out: dict[str, Dimension] = {}
    for name in names:
        if name in DIMENSIONS:
            out[name] = DIMENSIONS[name]
            continue
        module, _, attr = name.partition(":")
        try:
            out[attr or name] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError):
            raise ConfigError(f"rl.prm_dimensions names {name!r}, which is neither one of {sorted(DIMENSIONS)} "
                              "nor an importable package.module:function") from None
    return out


def _prefix_keys(ep: Episode) -> list[tuple]:
    """One key per main-path step: the task, the seed and the (state, action) pairs up to that step."""
    pairs, keys = [], []
    for t in ep.path():
        pairs.append((t.state_key, t.action_text))
        keys.append((ep.task_id, ep.seed, tuple(pairs)))
    return keys


def mc_targets(episodes: Sequence[Episode], *, gamma: float, score_key: str = "success") -> list[list[float]]:
    """Monte-Carlo labels in [0, 1] for every main-path step of every episode (module docstring).

    Args:
        episodes: The episodes (their ``rewards[score_key]`` is the outcome, > 0 = success).
        gamma: Discount per step to the episode's end.
        score_key: The named reward that decides success.

    Returns:
        Per episode, per step, ``(mean over episodes through the same prefix of gamma^(T-1-t) * o + 1) / 2``.
    """
    total: dict[tuple, float] = {}
    count: dict[tuple, int] = {}
    keys = [_prefix_keys(ep) for ep in episodes]
    for ep, ks in zip(episodes, keys, strict=True):
        o = 2.0 * outcome(ep.rewards.get(score_key)) - 1.0
        n = len(ks)
        for t, key in enumerate(ks):
            total[key] = total.get(key, 0.0) + gamma ** (n - 1 - t) * o
            count[key] = count.get(key, 0) + 1
    return [[0.5 * (total[k] / count[k] + 1.0) for k in ks] for ks in keys]


def dimension_targets(episodes: Sequence[Episode], labels: list[list[float]], dims: dict[str, Dimension]) -> Tensor:
    """``[N, D]`` target of each step (rows in collate order) for each dimension; NaN where it has none."""
    rows = []
    for ep, ep_labels in zip(episodes, labels, strict=True):
        turns = ep.path()
        for k, label in enumerate(ep_labels):
            vals = [fn(turns, k, label) for fn in dims.values()]
            rows.append([float("nan") if v is None else float(v) for v in vals])
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, len(dims))


class StepScorer(torch.nn.Module):
    """A causal transformer with a linear head: one logit per dimension at each token.

    Args:
        backbone: A Hugging Face causal LM (its ``base_model`` gives the hidden states).
        n_dims: Number of named dimensions.
    """

    def __init__(self, backbone: torch.nn.Module, n_dims: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(backbone.config.hidden_size, n_dims)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def step_logits(self, batch: TokenBatch, n_steps: int) -> tuple[Tensor, Tensor]:
        """Logits at the last token of each step of ``batch`` (``step_of_token`` ids in 0..n_steps-1).

        Returns:
            ``([n_present, D] logits, [n_present] step ids)`` for the steps that have tokens in ``batch``.
        """
        mask = batch.attention_mask.long()
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        last = last_token_of_steps(batch.step_of_token, n_steps)  # flat (B * T) index of each step's last token
        present = (last >= 0).nonzero()[:, 0]
        hidden = hidden_rows(self.backbone.base_model, batch.input_ids, mask, position_ids, last[present])
        return self.head(hidden.float()), present


class ExplicitPRM:
    """The explicit step scorer as a credit model (``rl.credit = "prm"``); see the module docstring.

    Args:
        cfg: The run's config (``rl.prm_*`` keys).
        policy: The start policy of RL (copied).
        tok: Its tokenizer.
    """

    def __init__(self, cfg: TrainConfig, policy: torch.nn.Module, tok) -> None:
        self.cfg = cfg
        self.dims = resolve_dimensions(cfg.rl.prm_dimensions)
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.model = StepScorer(trainable_copy(policy), len(self.dims))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.rl.prm_lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(cfg.seed + 11)
        self.last_scores: dict[str, float] = {}

    @torch.no_grad()
    def scores(self, batch: TokenBatch, n_steps: int) -> Tensor:
        """``[N, D]`` probability of each dimension for each step (0.5 for a step with no tokens in ``batch``)."""
        out = torch.full((n_steps, len(self.dims)), 0.5)
        for rows in length_chunks(batch, self.cfg.rl.prm_minibatch_size):
            logits, present = self.model.step_logits(batch.select(rows), n_steps)
            out[present] = torch.sigmoid(logits)
        return out

    def named_step_rewards(self, ctx: CreditContext) -> dict[str, Tensor]:
        """``{dimension: [N] scores}`` of this iteration's steps, one named reward per dimension."""
        probs = self.scores(ctx.batch, ctx.steps.episode.numel())
        return {name: probs[:, d] for d, name in enumerate(self.dims)}

    def step_inputs(self, ctx: CreditContext) -> dict[str, Tensor]:
        """``{"step_scores": [N]}``: the mean over the dimensions of each step's scores.

        The mean of each named reward over the iteration's active steps is reported by the next
        :meth:`fit` as ``prm/score_<dimension>``.
        """
        probs = self.scores(ctx.batch, ctx.steps.episode.numel())
        active = probs[ctx.steps.step_active()]
        self.last_scores = {f"prm/score_{name}": float(active[:, d].mean()) if active.numel() else 0.0
                            for d, name in enumerate(self.dims)}
        return {"step_scores": probs.mean(-1)}

    def training_episodes(self, ctx: CreditContext) -> list[Episode]:
        """The policy's episodes of the last ``rl.prm_window`` iterations, newest first, read from the store."""
        rc = self.cfg.rl
        out: list[Episode] = []
        cursor = None
        while len(out) < rc.prm_buffer:
            page = ctx.store.query(limit=min(100, rc.prm_buffer - len(out)), cursor=cursor, source="rl",
                                   min_iteration=max(0, ctx.iteration - rc.prm_window + 1))
            out += page.episodes
            cursor = page.next_cursor
            if cursor is None:
                break
        return out

    def fit(self, ctx: CreditContext) -> dict[str, float]:
        """``rl.prm_epochs`` passes of BCE on the Monte-Carlo targets of the stored episodes."""
        rc = self.cfg.rl
        episodes = self.training_episodes(ctx)
        if not episodes:
            return {"prm/episodes": 0.0}
        labels = mc_targets(episodes, gamma=rc.prm_target_gamma, score_key=rc.score_key)
        targets = dimension_targets(episodes, labels, self.dims)
        batch = collate(episodes, pad_id=self.pad)
        losses = []
        for _ in range(rc.prm_epochs):
            for rows in minibatches(batch, rc.prm_minibatch_size, self.gen):
                logits, present = self.model.step_logits(batch.select(rows), targets.shape[0])
                y = targets[present]
                has = ~torch.isnan(y)
                if not bool(has.any()):
                    continue
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[has], y[has])
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), rc.grad_clip)
                self.opt.step()
                losses.append(float(loss.detach()))
        labelled = ~torch.isnan(targets)
        metrics = {**self.last_scores, "prm/loss": sum(losses) / max(len(losses), 1),
                   "prm/episodes": float(len(episodes)),
                   "prm/labelled_steps": float(labelled.any(-1).sum())}
        for d, name in enumerate(self.dims):
            col = targets[:, d][labelled[:, d]]
            metrics[f"prm/target_{name}"] = float(col.mean()) if col.numel() else 0.0
        return metrics

    def state_dict(self) -> dict:
        """The scorer's weights and its optimizer state."""
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["gen"])
