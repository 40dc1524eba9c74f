"""Per-token log-probs (and entropies) of a causal LM over padded token sequences.

Convention shared with the rollout (:mod:`arborl.rollout.engine`): the log-prob of token ``t`` is
``log_softmax(logits[t-1] / temperature)[token_t]`` under the full distribution (no top-p
truncation); position 0 has no prediction and gets 0. The trainer must pass the temperature
the rollout sampled with (``1.0`` for greedy rollouts) to reproduce behaviour log-probs.

Positions are counted over real tokens only (``cumsum(attention_mask) - 1``), so left- and
right-padded batches give the same numbers as unpadded sequences.

Selective positions (``positions=``): the trainer needs log-probs only on trained tokens (the
loss mask: model-written tokens, ~15 % of an agent episode, whose prompt and tool results are
never trained on), yet a plain forward pass projects every position onto the whole vocabulary.
With ``positions`` the model body runs once, the final hidden states are gathered at the
predecessors of the wanted tokens, and the output layer is applied there only: ``(N, V)``
logits instead of ``(B, T, V)``. The numbers equal the full path's (same matmuls on the same
rows; ``tests/policy/test_logprobs_selective.py`` checks it on arborl's and other HF models).
For Llama and Qwen2 policies the last decoder layer, too, runs only at those predecessors
(:mod:`arborl.policy.tail`): equal to the full path to float rounding.
A model whose forward does more than ``lm_head(body(x))`` (final logit soft-capping or
scaling, or no separable body) is run the full way.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from arborl.policy import tail

# Config fields that make a model's logits more than ``lm_head(hidden)`` (Gemma-2 soft-capping,
# Cohere's logit_scale, Granite's logits_scaling): such models take the full path.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _check(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, temperature: float) -> torch.Tensor:
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
    return attention_mask.long()


def _body_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The model's body (hidden states) and output layer, when its logits are exactly ``head(body)``."""
    if not isinstance(model, PreTrainedModel):
        return None
    body, head = model.base_model, model.get_output_embeddings()
    if body is model or head is None:
        return None
    cfg = model.config
    if any(getattr(cfg, name, None) not in (None, 1, 1.0) for name in _LOGIT_POSTPROCESSING):
        return None
    if getattr(cfg, "image_token_id", None) is not None:  # a vision policy masks its placeholder's logit
        return None
    return body, head


def _entropy(logp_all: torch.Tensor, mode: str) -> torch.Tensor | None:
    """Entropy of each row's distribution: with gradients (``grad``), detached, or not at all (``none``)."""
    if mode == "none":
        return None
    with torch.set_grad_enabled(mode == "grad" and torch.is_grad_enabled()):
        return -(logp_all.exp() * logp_all).sum(-1)


def _full(model, input_ids, mask, position_ids, temperature, entropy, pixel_values=None):
    """Every position's logits: ``(B, T)`` log-probs and entropies (or None)."""
    images = {} if pixel_values is None else {"pixel_values": pixel_values}  # a vision policy's images
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False, **images)
    logits = out.logits[:, :-1].float() / temperature  # (B, T-1, V): predicts tokens 1..T-1
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    picked = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    ent = _entropy(logp_all, entropy)  # (B, T-1)
    # A token's prediction counts only if both it and its predecessor are real tokens.
    valid = (mask[:, 1:] * mask[:, :-1]).to(picked.dtype)
    zeros = picked.new_zeros(picked.shape[0], 1)
    return (torch.cat([zeros, picked * valid], dim=1),
            None if ent is None else torch.cat([zeros, ent * valid], dim=1))


def _selective(body, head, input_ids, mask, position_ids, temperature, entropy, positions):
    """Logits at the predecessors of ``positions`` only; zeros elsewhere."""
    want = positions.bool().clone()
    want[:, 0] = False
    want[:, 1:] &= (mask[:, 1:] * mask[:, :-1]).bool()
    rows, cols = want.nonzero(as_tuple=True)  # N wanted tokens
    before = torch.zeros_like(want)
    before[:, :-1] = want[:, 1:]  # their predecessors, in the same row-major order
    hidden = tail.final_hidden(body, input_ids, mask, position_ids, before)  # (N, H): the last layer only there
    logits = head(hidden).float() / temperature  # (N, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, input_ids[rows, cols].unsqueeze(-1)).squeeze(-1)  # (N,)
    ent = _entropy(logp_all, entropy)

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(input_ids.shape).index_put((rows, cols), values)

    return scatter(picked), None if ent is None else scatter(ent)


def _logprobs(model, input_ids, attention_mask, temperature, positions, entropy, pixel_values=None):
    mask = _check(input_ids, attention_mask, temperature)
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)  # (B, T)
    if positions is None or pixel_values is not None:
        logp, ent = _full(model, input_ids, mask, position_ids, temperature, entropy, pixel_values)
        if positions is None:
            return logp, ent
        keep = positions.to(logp.dtype)
        return logp * keep, None if ent is None else ent * keep
    if positions.shape != input_ids.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} differs from input_ids {tuple(input_ids.shape)}")
    parts = _body_and_head(model)
    if parts is not None:
        return _selective(*parts, input_ids, mask, position_ids, temperature, entropy, positions)
    logp, ent = _full(model, input_ids, mask, position_ids, temperature, entropy)
    keep = positions.to(logp.dtype)
    return logp * keep, None if ent is None else ent * keep


def token_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    positions: torch.Tensor | None = None,
    entropy_grad: bool = True,
    pixel_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each token given the tokens before it, and the entropy of that prediction.

    Args:
        model: A causal LM (gradients flow unless the caller disables them).
        input_ids: ``(B, T)`` token ids.
        attention_mask: ``(B, T)``, 1 for real tokens and 0 for padding (default: all ones).
        temperature: Logits are divided by it before the softmax (must be > 0).
        positions: ``(B, T)`` bool/0-1 mask of the tokens whose log-prob is wanted (e.g. the
            loss mask); the others get 0 and cost no output-layer work. ``None``: every token.
        entropy_grad: When False the entropy is a detached diagnostic (no full-vocabulary
            softmax enters the autograd graph); pass ``entropy_coef != 0``.
        pixel_values: A vision policy's images, in the order of their placeholder runs in
            ``input_ids`` (row-major; :mod:`arborl.policy.vision`). ``None``: text only.

    Returns:
        ``(logprobs, entropy)``, both ``(B, T)`` float32: ``logprobs[b, t]`` is
        ``log p(input_ids[b, t] | input_ids[b, :t])``, ``entropy[b, t]`` the entropy of that
        predictive distribution; position 0, padding positions and positions not wanted are 0.
    """
    logp, ent = _logprobs(model, input_ids, attention_mask, temperature, positions,
                          "grad" if entropy_grad else "detached", pixel_values)
    return logp, ent


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    positions: torch.Tensor | None = None,
    pixel_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, T)`` log-prob of each token given the tokens before it (see :func:`token_logprobs_and_entropy`).

    Entropy is not computed.
    """
    return _logprobs(model, input_ids, attention_mask, temperature, positions, "none", pixel_values)[0]
