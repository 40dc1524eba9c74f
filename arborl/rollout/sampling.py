"""Draw the next token of each row from logits, and record its behaviour log-prob.

The recorded log-prob is ``log_softmax(logits / T)[token]`` under the *full* distribution, with
``T = cfg.logprob_temperature`` (the sampling temperature, or 1 for greedy decoding). Top-p
only restricts which tokens may be drawn; the trainer recomputes the same full-softmax quantity,
so the importance ratio at the behaviour policy is exactly 1 (a slight departure from treating
the truncated distribution as the behaviour policy, which no trainer can reproduce cheaply).

Sampling uses the Gumbel-max trick with uniforms from the caller's ``torch.Generator``: one
``torch.rand`` call per step, so a run is reproducible from the generator's seed.
"""

from __future__ import annotations

import torch

from arborl.rollout.config import SamplingConfig


def sample_next(
    logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: ``(B, V)`` next-token logits.
        cfg: Sampling settings.
        generator: Source of randomness (CPU generator).

    Returns:
        ``(tokens, logprobs)``, both ``(B,)``: the drawn ids (long) and their behaviour
        log-probs (float32).
    """
    logits = logits.float()
    logp = torch.log_softmax(logits / cfg.logprob_temperature, dim=-1)  # (B, V)
    if cfg.greedy:
        tokens = logits.argmax(dim=-1)
    else:
        scores = logp
        if cfg.top_p < 1.0:
            scores = _top_p_filter(logp, cfg.top_p)
        # Draw on the generator's device (a CPU generator can drive a GPU model reproducibly).
        u = torch.rand(scores.shape, generator=generator, device=generator.device).to(scores.device)
        gumbel = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
        tokens = (scores + gumbel).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logp`` with tokens outside the smallest set of mass >= ``top_p`` set to -inf."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)  # (B, V)
    cum = sorted_logp.exp().cumsum(dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p; the top token stays.
    drop_sorted = (cum - sorted_logp.exp()) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))
