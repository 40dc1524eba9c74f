"""From trajectory records to training tensors: the one adapter between ``trajectory`` and ``credit``/``loss``.

:func:`collate` flattens each episode's main path (token-in, token-out: the stored ids, never
re-tokenized text) into right-padded ``[B, T]`` tensors. :func:`step_batch` builds the
:class:`~arborl.credit.StepBatch` the credit estimators take, and :func:`broadcast` spreads one
advantage per step over the trained tokens of that step's turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from arborl.credit import StepBatch
from arborl.policy import packed
from arborl.rollout.branch import credited_turns
from arborl.rollout.media import ImageInputs
from arborl.trajectory import Episode, linearize
from arborl.trajectory.schema import LinearView


@dataclass
class TokenBatch:
    """Right-padded token tensors of B episodes.

    Attributes:
        input_ids: ``[B, T]`` long.
        attention_mask: ``[B, T]`` long, 1 on real tokens.
        loss_mask: ``[B, T]`` float, 1 on trained (model-generated) tokens.
        old_logp: ``[B, T]`` behaviour log-probs (0 where not generated).
        step_of_token: ``[B, T]`` long, global step index (into the StepBatch) of each token, -1 on padding.
        pixel_values: ``[N, C, H, W]`` images of a vision policy's placeholder runs, row by row in
            token order (``None``: no images); rebuilt from the stored references.
        image_row: ``[N]`` long, the row of each image.
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logp: Tensor
    step_of_token: Tensor
    pixel_values: Tensor | None = None
    image_row: Tensor | None = None

    def select(self, rows: Tensor) -> TokenBatch:
        """Rows ``rows`` as a new batch, trimmed to their longest sequence (with their images, in the new row order)."""
        width = int(self.attention_mask[rows].sum(-1).max().item()) if len(rows) else 1
        tensors = (t[rows, :width] for t in (self.input_ids, self.attention_mask, self.loss_mask, self.old_logp,
                                             self.step_of_token))
        if self.pixel_values is None or self.image_row is None:
            return TokenBatch(*tensors)
        picks = [(self.image_row == r).nonzero()[:, 0] for r in rows.tolist()]
        idx = torch.cat(picks) if picks else self.image_row[:0]
        if not len(idx):
            return TokenBatch(*tensors)
        new_row = torch.cat([torch.full((len(p),), i, dtype=torch.long) for i, p in enumerate(picks)])
        return TokenBatch(*tensors, self.pixel_values[idx], new_row)


def length_chunks(batch: TokenBatch, size: int) -> list[Tensor]:
    """Row indices in chunks of ``size`` rows of similar length (sorted by length, ties by row).

    Right padding makes a minibatch as wide as its longest row; when short and long episodes are
    mixed (a branch is a few turns, a failing trunk many), random minibatches spend most of
    their forward and backward pass on padding. Chunks of similar lengths do not; the trainer
    shuffles the order of the chunks instead of the rows.
    """
    lengths = batch.attention_mask.sum(-1)
    order = torch.sort(lengths, stable=True).indices
    return list(order.split(size))


def micro_chunks(batch: TokenBatch, rows: Tensor, max_tokens: int) -> list[Tensor]:
    """``rows`` split into consecutive pieces whose padded size (rows x longest row) is at most ``max_tokens``.

    ``rows`` keep their order (a :func:`length_chunks` chunk is sorted by length, so each piece is as
    narrow as its rows allow); a row longer than ``max_tokens`` is a piece of its own. ``max_tokens``
    0: one piece, ``rows`` itself.
    """
    if not max_tokens or not len(rows):
        return [rows]
    pieces, start, width = [], 0, 0
    for i, n in enumerate(batch.attention_mask[rows].sum(-1).tolist()):
        if i > start and (i - start + 1) * max(width, n) > max_tokens:
            pieces.append(rows[start:i])
            start, width = i, 0
        width = max(width, n)
    pieces.append(rows[start:])
    return pieces


def prefix_chunks(batch: TokenBatch, rows: Tensor, max_tokens: int) -> list[Tensor]:
    """``rows`` in lexicographic order, split into consecutive pieces of at most ``max_tokens`` distinct prefixes.

    The pieces of a prefix-shared pass (``rl.prefix_share``): a piece costs its distinct prefixes
    (:func:`arborl.policy.packed.distinct_prefixes`), and rows next to each other in lexicographic
    order share the most. A row with more tokens than ``max_tokens`` is a piece of its own.
    ``max_tokens`` 0: one piece.
    """
    if not len(rows):
        return [rows]
    ids, order = packed.lexicographic(batch.input_ids[rows], batch.attention_mask[rows])
    rows = rows[order]
    if not max_tokens:
        return [rows]
    piece = torch.tensor(packed.layout([len(r) for r in ids], packed.lcps(ids), max_tokens))  # a pack = a piece
    return list(rows.split(torch.bincount(piece).tolist()))


def collate(episodes: Sequence[Episode], *, pad_id: int = 0, images: ImageInputs | None = None) -> TokenBatch:
    """Flatten each episode's main path into padded tensors; steps are numbered globally in order.

    A continuation's shared prefix (its trunk's turns) is context only (loss mask 0: the trunk
    trains on them), and a branch episode is cut after its forced action turn: nothing later is
    trained on, so it need not be in the forward pass. With ``images`` (a vision policy), the
    images the turns reference are read back from the store into ``pixel_values``.
    """
    views = [_trained_view(ep) for ep in episodes]
    width = max((len(v.input_ids) for v in views), default=1) or 1
    b = len(views)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    lmask = torch.zeros((b, width), dtype=torch.float32)
    old = torch.zeros((b, width), dtype=torch.float32)
    sot = torch.full((b, width), -1, dtype=torch.long)
    offset = 0
    for i, v in enumerate(views):
        n = len(v.input_ids)
        ids[i, :n] = torch.tensor(v.input_ids, dtype=torch.long)
        att[i, :n] = 1
        lmask[i, :n] = torch.tensor(v.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(v.logprobs, dtype=torch.float32)
        sot[i, :n] = torch.tensor(v.turn_index, dtype=torch.long) + offset
        offset += len(v.turns)
    got = None if images is None else images.rows([v.turns[:max(v.turn_index, default=-1) + 1] for v in views])
    return TokenBatch(ids, att, lmask, old, sot, *(got or ()))


def _trained_view(ep: Episode) -> LinearView:
    view = linearize(ep)
    if ep.origin is None:
        return view
    first, stop = credited_turns(ep)
    n = sum(1 for k in view.turn_index if k < stop) if stop < len(view.turns) else len(view.input_ids)
    mask = [m if k >= first else 0 for m, k in zip(view.loss_mask[:n], view.turn_index, strict=False)]
    return LinearView(view.input_ids[:n], mask, view.logprobs[:n], view.turn_index[:n], view.turns)


FAILED_STOPS = ("env_error", "max_context")
"""Stop reasons of episodes that ended on a failure rather than by the policy's play; ``rl.error_policy``
drops them from the update or scores them 0."""


def failed(episode: Episode) -> bool:
    """Whether the episode ended on an env/tool error or a context overflow (see :data:`FAILED_STOPS`)."""
    return episode.stop_reason in FAILED_STOPS


def step_batch(
    episodes: Sequence[Episode], *, score_key: str = "success", invalid_penalty: float = 0.0,
    zero: Sequence[bool] | None = None,
) -> StepBatch:
    """Credit input: one row per turn of each main path, groups and anchors as dense ids.

    The episode score is ``rewards[score_key]`` (``None`` counts as 0) plus ``invalid_penalty``
    per invalid action, so a malformed answer lowers the trajectory's advantage as well as its
    own step's return. An episode with ``zero[e]`` true is scored 0: score and step rewards
    (``rl.error_policy = "zero"`` for failed episodes).

    Continuations (``Episode.origin``: branches of :mod:`arborl.rollout.branch`, tree continuations
    of :mod:`arborl.rollout.tree`) are not policy samples from the start state (``sampled``
    False); their shared prefix is the trunk's and gets no credit here (``active``), and a
    branch's credit is its forced action only. The rewards after it still count in its return. A
    continuation whose re-play diverged gets none. ``node``/``parent`` give the rollout tree: a
    shared prefix turn has one node, the trunk's.
    """
    group_ids: dict[str, int] = {}
    anchor_ids: dict[str, int] = {}
    node_ids: dict[tuple[str, str], int] = {}
    parent: list[int] = []
    by_id = {ep.episode_id: ep for ep in episodes}
    ep_idx, step, reward, anchor, group, score, active, sampled, node = [], [], [], [], [], [], [], [], []
    for e, ep in enumerate(episodes):
        group.append(group_ids.setdefault(ep.group_id or ep.episode_id, len(group_ids)))
        base = ep.rewards.get(score_key)
        own_from = 0 if ep.origin is None else ep.origin.turn
        sampled.append(ep.origin is None)
        first, stop = credited_turns(ep)
        penalty, up, scored = 0.0, -1, not (zero is not None and zero[e])
        for k, t in enumerate(ep.path()):
            ep_idx.append(e)
            step.append(k)
            reward.append(t.reward if scored else 0.0)
            anchor.append(anchor_ids.setdefault(t.state_key or f"{ep.episode_id}:{k}", len(anchor_ids)))
            active.append(first <= k < stop)
            penalty += 0.0 if t.valid or k < own_from else invalid_penalty
            key = (_owner(ep, k, by_id), t.turn_id)
            if key not in node_ids:
                node_ids[key] = len(parent)
                parent.append(up)
            up = node_ids[key]
            node.append(up)
        score.append((base or 0.0) + penalty if scored else 0.0)
    return StepBatch(
        episode=torch.tensor(ep_idx, dtype=torch.long),
        step=torch.tensor(step, dtype=torch.long),
        reward=torch.tensor(reward, dtype=torch.float32),
        anchor=torch.tensor(anchor, dtype=torch.long),
        group=torch.tensor(group, dtype=torch.long),
        score=torch.tensor(score, dtype=torch.float32),
        active=None if all(active) else torch.tensor(active, dtype=torch.bool),
        sampled=None if all(sampled) else torch.tensor(sampled, dtype=torch.bool),
        node=torch.tensor(node, dtype=torch.long),
        parent=torch.tensor(parent, dtype=torch.long),
    )


def _owner(ep: Episode, k: int, by_id: dict[str, Episode]) -> str:
    """Id of the episode whose own turn is path index ``k`` of ``ep`` (a shared prefix turn is its trunk's)."""
    eid, o = ep.episode_id, ep.origin
    while o is not None and k < o.turn:
        eid = o.of
        trunk = by_id.get(eid)
        o = None if trunk is None else trunk.origin
    return eid


def broadcast(step_values: Tensor, step_of_token: Tensor) -> Tensor:
    """``[N]`` per-step values to ``[B, T]`` per-token values (0 on padding)."""
    idx = step_of_token.clamp_min(0)
    out = step_values[idx]
    return torch.where(step_of_token >= 0, out, torch.zeros_like(out))
