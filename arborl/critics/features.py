"""What the turn-level critics read: a hidden state at the state and at the action of every turn.

The state ``s_h`` of turn ``h`` is the episode's token sequence up to the last prompt token of
that turn (everything the model read before writing it); the action ``a_h`` ends at the turn's
last generated token. A transformer's last-layer hidden state at a position summarises the
tokens up to it, so a critic is a small head on those vectors. The state after an episode's last
turn is read at the episode's last token: its observation was never rendered (the episode
stopped), so this is the closest state there is (AReaL's turn-level GAE bootstraps from the
value at the last valid token the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from arborl.policy.tail import hidden_rows
from arborl.trajectory import Turn

BOOTSTRAP_STOPS = ("max_turns", "max_context", "truncated")
"""Stop reasons after which the episode had a future: its last turn is bootstrapped from the critic.
``terminated`` (and ``env_error``, whose future is unknown) end the return at 0."""


@dataclass
class TurnPositions:
    """Token positions of one path (main path, or its first turns) in its flattened sequence.

    Attributes:
        ids: The token ids of the path's turns, prompt then output, turn by turn.
        state: Position of the last prompt token of each turn (``s_h``).
        action: Position of the last token of each turn (the end of ``a_h``; ``s_h`` if it wrote nothing).
    """

    ids: list[int]
    state: list[int]
    action: list[int]


def turn_positions(turns: Sequence[Turn]) -> TurnPositions:
    """Flatten ``turns`` like :func:`arborl.trajectory.linearize` and find each turn's state and action ends."""
    ids: list[int] = []
    state, action = [], []
    for t in turns:
        ids += t.prompt_ids
        state.append(max(len(ids) - 1, 0))
        ids += t.output_ids
        action.append(max(len(ids) - 1, 0))
    return TurnPositions(ids, state, action)


def bootstraps(stop_reason: str) -> bool:
    """Whether an episode that stopped for ``stop_reason`` was cut by a budget (bootstrap its last turn)."""
    return stop_reason in BOOTSTRAP_STOPS


def offsets(sizes: Sequence[int]) -> list[int]:
    """Start of each block when blocks of ``sizes`` are laid end to end."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


def hidden_at(trunk: nn.Module, sequences: Sequence[list[int]], positions: Sequence[list[int]], *,
              pad_id: int = 0, chunk: int = 16) -> list[Tensor]:
    """Last-layer hidden states of ``trunk`` (a transformer body, e.g. ``policy.base_model``) at positions.

    Args:
        trunk: Called as ``trunk(input_ids=, attention_mask=, position_ids=)``; returns ``last_hidden_state``
            (a Llama/Qwen2 body runs its last layer only at the wanted positions: :mod:`arborl.policy.tail`).
        sequences: Token ids of each sequence (right-padded into chunks of ``chunk`` sequences).
        positions: For each sequence, the positions to read.
        pad_id: Padding id.
        chunk: Sequences per forward pass.

    Returns:
        One ``[len(positions[i]), H]`` float32 tensor per sequence; gradients flow when enabled.
    """
    out: list[Tensor] = []
    for lo in range(0, len(sequences), chunk):
        seqs = sequences[lo: lo + chunk]
        width = max(max(len(s) for s in seqs), 1)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            att[i, : len(s)] = 1
        pos = (att.cumsum(-1) - 1).clamp_min(0)
        wanted = positions[lo: lo + chunk]
        flat = torch.tensor([i * width + q for i, p in enumerate(wanted) for q in p], dtype=torch.long)
        hidden = hidden_rows(trunk, ids, att, pos, flat)  # the last layer only at the wanted positions
        out += list(hidden.float().split([len(p) for p in wanted]))
    return out


def mlp_head(n_in: int, width: int, *, seed: int) -> nn.Sequential:
    """``n_in -> width -> 1`` (tanh), initialised from ``seed`` without touching the global RNG stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Sequential(nn.Linear(n_in, width), nn.Tanh(), nn.Linear(width, 1))
    return head


def trunk_of(policy: nn.Module) -> nn.Module:
    """The transformer body of a causal LM (its hidden states without the LM head)."""
    return policy.base_model


def pad_id_of(tok) -> int:
    """The tokenizer's pad id (0 when it has none)."""
    return tok.pad_token_id if tok.pad_token_id is not None else 0
