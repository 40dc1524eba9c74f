"""Policy-gradient, KL and SFT losses as pure tensor functions.

Shapes: ``B`` sequences, ``T`` tokens. ``mask[B, T]`` is 1 on trained tokens only, and every
loss is multiplied by it *before* aggregation, so masked tokens get exactly zero gradient.

Each loss returns a :class:`LossOutput`: the scalar to backpropagate, its named terms and
diagnostics. Metric names (also logged by the trainer):

* ``loss/policy`` — the clipped surrogate, aggregated.
* ``loss/kl`` — KL to the reference policy (estimator ``kl_kind``), aggregated.
* ``loss/entropy`` — mean token entropy (bonus enters with ``-entropy_coef``).
* ``diag/clip_frac`` — fraction of trained tokens where the clipped branch was active.
* ``diag/approx_kl`` — mean of ``0.5 * (logp - old_logp)^2`` (k2 estimate of KL(old || new)).
* ``diag/ratio_max`` — largest importance ratio in the batch.
* ``diag/behav_weight_mean`` / ``diag/behav_weight_max`` — with ``prox_logp`` (decoupled PPO), the mean
  and largest behaviour weight ``pi_prox / pi_behav`` over trained tokens, before truncation.
* ``diag/behav_trunc_frac`` — fraction of trained tokens whose behaviour weight was truncated at ``behav_cap``
  (``behav_mode = "mask"``: that left the band ``[1 / behav_cap, behav_cap]`` and were dropped).
* ``diag/behav_logp_gap`` — mean ``|log pi_prox - log pi_behav|`` over trained tokens: how far the sampler's
  log-probs are from the trainer's (0 up to rounding for a fresh float32 batch).

Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization"; AReaL, Fu et al.
2025, Eq. 5) separates the two roles the "old" policy plays in PPO when rollouts are stale: the
*behaviour* policy that sampled the tokens (``old_logp``, recorded at sampling time) and the
*proximal* policy the trust region is drawn around (``prox_logp``: the weights just before this
update, recomputed). The clipped ratio is ``pi_theta / pi_prox``, and each token's surrogate is
weighted by the detached behaviour ratio ``w = pi_prox / pi_behav``, truncated at ``behav_cap``
(departure from AReaL, which drops the tokens above its cap: truncating keeps them, biased but
bounded, as V-trace's rho-bar does). ``behav_mode = "mask"`` instead drops every token whose weight
leaves the band ``[1 / behav_cap, behav_cap]`` from the whole loss, denominator included (masked
importance sampling, as verl and slime offer against a sampler in another precision), and weights
the others by their untruncated ``w``. With ``prox_logp = old_logp`` either is PPO-clip exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3", "abs")
BEHAV_MODES = ("truncate", "mask")


@dataclass
class LossOutput:
    """A scalar loss plus named terms and diagnostics (floats, detached)."""

    loss: Tensor
    terms: dict[str, float] = field(default_factory=dict)


def aggregate(values: Tensor, mask: Tensor, mode: str = "token-mean", *, norm_length: float | None = None) -> Tensor:
    """Reduce ``values[B, T]`` over trained tokens.

    Modes (verl's names): ``token-mean`` = sum/count over all trained tokens; ``seq-mean-token-sum``
    = mean over rows of the row sum; ``seq-mean-token-mean`` = mean over rows (with >=1 trained
    token) of the row mean; ``seq-mean-token-sum-norm`` (Dr.GRPO) = total sum / (rows * L) with
    ``L = norm_length`` or the padded width.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGG_MODES}")
    mask = mask.to(values.dtype)
    v = values * mask
    if mode == "token-mean":
        return v.sum() / mask.sum().clamp_min(1.0)
    if mode == "seq-mean-token-sum":
        return v.sum(-1).mean()
    if mode == "seq-mean-token-mean":
        rows = mask.sum(-1)
        keep = rows > 0
        if not keep.any():
            return v.sum() * 0.0
        return (v.sum(-1)[keep] / rows[keep]).mean()
    length = float(norm_length) if norm_length is not None else float(values.shape[-1])
    return v.sum() / (values.shape[0] * length)


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || ref) estimates from sampled-token log-probs (Schulman's k1/k2/k3).

    ``k3`` = exp(ref - logp) - (ref - logp) - 1 (unbiased, non-negative); the log-ratio is clamped
    to +-20 and k3 to [-10, 10] as in verl's ``low_var_kl``.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")
    diff = logp - ref_logp
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff**2
    log_ratio = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = 3.0,
    agg: str = "token-mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    prox_logp: Tensor | None = None,
    behav_cap: float = 5.0,
    behav_mode: str = "truncate",
) -> LossOutput:
    """PPO clipped surrogate with dual clip, optional KL-to-reference and entropy terms.

    With ``prox_logp`` it is decoupled PPO (see the module docstring): the ratio is taken to the
    proximal policy and the surrogate weighted by ``min(pi_prox / pi_behav, behav_cap)``.

    Args:
        logp: ``[B, T]`` log-probs of the taken tokens under the current policy (with grad).
        old_logp: ``[B, T]`` behaviour log-probs (no grad).
        advantages: ``[B, T]`` per-token advantages (already broadcast from steps).
        mask: ``[B, T]`` 1 on trained tokens.
        clip_low: the ratio is clipped below at ``1 - clip_low``.
        clip_high: the ratio is clipped above at ``1 + clip_high`` (DAPO's clip-higher when larger).
        clip_c: dual-clip constant for negative advantages (None disables it).
        agg: aggregation mode, see :func:`aggregate`.
        ref_logp: ``[B, T]`` reference-policy log-probs; required when ``kl_coef > 0``.
        kl_coef: weight of the KL loss term.
        kl_kind: KL estimator, see :func:`kl_estimate`.
        entropy: ``[B, T]`` token entropies (with grad) for the bonus.
        entropy_coef: weight of the entropy bonus.
        prox_logp: ``[B, T]`` proximal-policy log-probs (no grad): the policy before this update, when
            the batch was sampled by an older one (``rl.max_staleness``) or in another precision
            (``rl.recompute_logp``); None: PPO-clip to ``old_logp``.
        behav_cap: truncation of the behaviour weight ``pi_prox / pi_behav`` (decoupled PPO only).
        behav_mode: ``truncate`` (weights above ``behav_cap`` are set to it) or ``mask`` (tokens whose weight
            is outside ``[1 / behav_cap, behav_cap]`` leave the loss; decoupled PPO only).
    """
    if behav_mode not in BEHAV_MODES:
        raise ValueError(f"unknown behaviour-weight mode {behav_mode!r}; choose one of {BEHAV_MODES}")
    anchor = old_logp if prox_logp is None else prox_logp
    log_ratio = torch.clamp(logp - anchor, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    if clip_c is not None:
        pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * clip_c), pg)
    behav = past = None
    trained = mask  # the tokens the behaviour diagnostics are over
    if prox_logp is not None:  # decoupled PPO: correct for the stale sampler, trust region around pi_prox
        behav = torch.exp(torch.clamp(prox_logp - old_logp, -20.0, 20.0)).detach()
        if behav_mode == "mask":  # weights outside [1 / cap, cap]: the token leaves the loss
            past = (behav > behav_cap) | (behav < 1.0 / behav_cap)
            mask = mask * (~past).to(mask.dtype)
            pg = pg * behav
        else:  # weights above the cap are set to it
            past = behav > behav_cap
            pg = pg * torch.clamp(behav, max=behav_cap)
    policy = aggregate(pg, mask, agg)
    total = policy
    terms: dict[str, float] = {"loss/policy": float(policy.detach())}
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (log-probs of the reference policy)")
        kl = aggregate(kl_estimate(logp, ref_logp, kl_kind), mask, agg)
        total = total + kl_coef * kl
        terms["loss/kl"] = float(kl.detach())
    if entropy is not None:
        ent = aggregate(entropy, mask, "token-mean")
        total = total - entropy_coef * ent
        terms["loss/entropy"] = float(ent.detach())
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp_min(1.0)
        terms["diag/clip_frac"] = float(((pg2 > pg1).to(m.dtype) * m).sum() / n)
        terms["diag/approx_kl"] = float((0.5 * log_ratio**2 * m).sum() / n)
        terms["diag/ratio_max"] = float((ratio * m).max()) if m.any() else 1.0
        if behav is not None:
            terms |= _behaviour_diagnostics(behav, past, trained.to(logp.dtype))
    return LossOutput(total, terms)


def _behaviour_diagnostics(behav: Tensor, past: Tensor, m: Tensor) -> dict[str, float]:
    """Mean and max of the behaviour weights over trained tokens ``m``, the share ``past`` the cap (truncated or
    masked), and their mean log gap.
    """
    n = m.sum().clamp_min(1.0)
    return {
        "diag/behav_weight_mean": float((behav * m).sum() / n),
        "diag/behav_weight_max": float((behav * m).max()) if m.any() else 1.0,
        "diag/behav_trunc_frac": float((past.to(m.dtype) * m).sum() / n),
        "diag/behav_logp_gap": float((behav.log().abs() * m).sum() / n),
    }


def sft_loss(logp: Tensor, mask: Tensor, *, agg: str = "token-mean") -> LossOutput:
    """Masked negative log-likelihood of the demonstrated tokens (``logp[B, T]`` with grad)."""
    nll = aggregate(-logp, mask, agg)
    return LossOutput(nll, {"loss/sft": float(nll.detach())})
