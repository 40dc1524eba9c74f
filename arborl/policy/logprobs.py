"""Per-token log-probs (and entropies) of a causal LM over padded token sequences.

Convention shared with the rollout (:mod:`arborl.rollout.engine`): the log-prob of token ``t`` is
``log_softmax(logits[t-1] / temperature)[token_t]`` under the full distribution (no top-p
truncation); position 0 has no prediction and gets 0. The trainer must pass the temperature
the rollout sampled with (``1.0`` for greedy rollouts) to reproduce behaviour log-probs.

Positions are counted over real tokens only (``cumsum(attention_mask) - 1``), so left- and
right-padded batches give the same numbers as unpadded sequences.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def token_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each token given the tokens before it, and the entropy of that prediction.

    Args:
        model: A causal LM (gradients flow unless the caller disables them).
        input_ids: ``(B, T)`` token ids.
        attention_mask: ``(B, T)``, 1 for real tokens and 0 for padding (default: all ones).
        temperature: Logits are divided by it before the softmax (must be > 0).

    Returns:
        ``(logprobs, entropy)``, both ``(B, T)`` float32: ``logprobs[b, t]`` is
        ``log p(input_ids[b, t] | input_ids[b, :t])``, ``entropy[b, t]`` the entropy of that
        predictive distribution; position 0 and padding positions are 0.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature is {temperature}; use a positive number (1.0 for greedy rollouts)")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids {tuple(input_ids.shape)}"
        )
    mask = attention_mask.long()
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)  # (B, T)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, :-1].float() / temperature  # (B, T-1, V): predicts tokens 1..T-1
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    picked = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T-1)
    # A token's prediction counts only if both it and its predecessor are real tokens.
    valid = (mask[:, 1:] * mask[:, :-1]).to(picked.dtype)
    zeros = picked.new_zeros(picked.shape[0], 1)
    return torch.cat([zeros, picked * valid], dim=1), torch.cat([zeros, entropy * valid], dim=1)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``(B, T)`` log-prob of each token given the tokens before it (see :func:`token_logprobs_and_entropy`)."""
    return token_logprobs_and_entropy(model, input_ids, attention_mask, temperature=temperature)[0]
