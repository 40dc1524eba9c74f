"""Merge methods as pure functions of one tensor name's values in every source checkpoint.

Each function takes the source tensors of one parameter (all the same shape) and returns the
merged tensor; :mod:`arborl.merge.checkpoint` calls it once per tensor name, so only one
parameter's values are in memory at a time. Shapes: every tensor is ``(*S)``, any shape.

* :func:`linear`: ``sum_i w_i theta_i / sum_i w_i`` (a weighted average; Wortsman et al. 2022,
  "model soups").
* :func:`slerp`: spherical interpolation of two tensors at ``t``: the coefficients come from the
  angle ``omega`` between the flattened tensors, ``sin((1-t) omega) / sin omega`` and
  ``sin(t omega) / sin omega``, and multiply the tensors themselves (not their unit vectors), so
  at ``t = 0`` and ``t = 1`` the result is a source exactly. Nearly parallel tensors
  (``sin omega < 1e-6``) fall back to linear interpolation, where the formula is 0/0.
* :func:`task_arithmetic`: ``base + sum_i w_i (theta_i - base)`` (Ilharco et al. 2023).
* :func:`ties`: TIES-Merging (Yadav et al. 2023, Alg. 1): trim each task vector to its
  ``density`` fraction of largest magnitudes, elect the sign of ``sum_i w_i tau_i`` per entry, and
  average the entries that agree with it, weighted by ``w_i`` (the paper's disjoint mean is the
  case of equal weights; its scaling lambda is ``scale``).
* :func:`dare`: DARE (Yu et al. 2024, Eq. 2): drop each task-vector entry with probability
  ``1 - density`` and divide the kept ones by ``density``, then add them as task arithmetic does.

Memory: ``linear`` and ``slerp`` accumulate in place, so they hold two source tensors at once;
``task_arithmetic`` is ``linear`` with the base weighted ``1 - sum_i w_i`` (two at once too);
``dare`` three (the base, the result, one task vector and its mask); ``ties`` every source's task
vector of the tensor plus the base (it elects the sign over all of them), which is why
:mod:`arborl.merge.checkpoint` runs its elementwise part, :func:`ties_combine`, on slices of rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Load = Callable[[int], Tensor]
"""``load(i)`` returns a fresh float32 copy of source ``i``'s tensor (the caller may modify it)."""


def linear(load: Load, weights: Sequence[float], *, normalize: bool = True) -> Tensor:
    """Weighted sum ``sum_i w_i theta_i`` (divided by ``sum_i w_i`` when ``normalize``).

    Args:
        load: Source loader (see :data:`Load`); sources ``0 .. len(weights) - 1``.
        weights: One weight per source.
        normalize: Divide by the sum of the weights (a weighted average).

    Returns:
        The merged tensor, float32. With weights ``(1, 0)`` it equals source 0 exactly.
    """
    total = float(sum(weights)) if normalize else 1.0
    if normalize and total == 0:
        raise ValueError("merge weights sum to 0; a weighted average needs a nonzero sum")
    out = load(0).mul_(weights[0] / total)
    for i in range(1, len(weights)):
        if weights[i] != 0:  # 0 * x is not 0 for inf/nan entries; a source with weight 0 is left out
            out.add_(load(i), alpha=weights[i] / total)
    return out


def slerp(load: Load, t: float) -> Tensor:
    """Spherical interpolation from source 0 (``t = 0``) to source 1 (``t = 1``).

    Args:
        load: Source loader with two sources.
        t: Interpolation factor in ``[0, 1]``.

    Returns:
        ``c0 * theta_0 + c1 * theta_1`` with the angle-based coefficients of the module docstring.
    """
    a, b = load(0), load(1)
    na, nb = a.norm().item(), b.norm().item()
    if na == 0 or nb == 0:
        c0, c1 = 1.0 - t, t  # no direction to rotate along
    else:
        cos = max(-1.0, min(1.0, float(torch.dot(a.flatten(), b.flatten()).item()) / (na * nb)))
        omega = math.acos(cos)
        s = math.sin(omega)
        c0, c1 = ((1.0 - t), t) if s < 1e-6 else (math.sin((1.0 - t) * omega) / s, math.sin(t * omega) / s)
    del na, nb
    return a.mul_(c0).add_(b, alpha=c1)


def task_arithmetic(load: Load, base: Load, weights: Sequence[float]) -> Tensor:
    """``base + sum_i w_i (theta_i - base)``, computed as ``(1 - sum w) base + sum_i w_i theta_i``.

    Args:
        load: Source loader of the fine-tuned models.
        base: Loader of the base model's tensor (``base(0)``).
        weights: One weight per source (the task vectors' scales).
    """
    rest = 1.0 - float(sum(weights))
    both = [rest, *weights]
    return linear(lambda i: base(0) if i == 0 else load(i - 1), both, normalize=False)


def task_vectors(load: Load, base: Tensor, n: int) -> list[Tensor]:
    """``theta_i - base`` for sources ``0 .. n-1`` (each a new tensor)."""
    return [load(i).sub_(base) for i in range(n)]


def magnitude_threshold(mag: Tensor, density: float) -> float:
    """The ``k``-th largest value of ``mag`` (``|tau|``, float32), ``k = max(1, round(density * numel))``.

    Reorders ``mag`` in place (numpy's introselect: torch's kthvalue and topk take 1.5-3x the tensor
    in scratch memory). Returns 0.0 when every entry is kept.
    """
    flat = mag.reshape(-1)
    k = max(1, round(density * flat.numel()))
    if k >= flat.numel():
        return 0.0
    cut = flat.numel() - k
    flat.numpy().partition(cut)
    return float(flat[cut])


def trim(tau: Tensor, density: float) -> Tensor:
    """Zero, in place, all but the ``round(density * numel)`` entries of largest magnitude (at least 1).

    The cut is a magnitude threshold (the k-th largest ``|tau|``), so entries tied with it are all kept.
    """
    threshold = magnitude_threshold(tau.abs(), density)
    return tau.masked_fill_(tau.abs() < threshold, 0.0)


def ties(load: Load, base: Load, weights: Sequence[float], *, density: float, scale: float = 1.0) -> Tensor:
    """TIES-Merging: trim, elect sign, disjoint weighted mean, added to the base.

    Args:
        load: Source loader of the fine-tuned models.
        base: Loader of the base tensor.
        weights: One weight per source.
        density: Fraction of each task vector's entries kept by magnitude, in ``(0, 1]``.
        scale: Lambda, the factor of the merged task vector.
    """
    b = base(0)
    taus = task_vectors(load, b, len(weights))
    thresholds = [magnitude_threshold(t.abs(), density) for t in taus]
    return ties_combine(b, taus, weights, thresholds, scale=scale)


def ties_combine(b: Tensor, taus: list[Tensor], weights: Sequence[float], thresholds: Sequence[float], *,
                 scale: float = 1.0) -> Tensor:
    """TIES's elementwise part on a tensor or any slice of it: ``b`` plus the merged trimmed task vectors.

    Args:
        b: Base values (modified in place and returned).
        taus: Task vectors ``theta_i - b`` over the same entries (modified in place).
        weights: One weight per task vector.
        thresholds: Per task vector, the magnitude below which its entries are trimmed
            (:func:`magnitude_threshold` over the whole tensor, so slices agree with the whole).
        scale: Factor of the merged task vector.
    """
    for t, w, thr in zip(taus, weights, thresholds, strict=True):
        t.masked_fill_(t.abs() < thr, 0.0).mul_(w)  # weighted, trimmed task vectors
    sign = taus[0].clone()
    for t in taus[1:]:
        sign.add_(t)
    sign.sign_()  # the elected sign, that of the weighted entries' total mass
    den = torch.zeros_like(b)  # sum of the weights of the entries that agree with the elected sign
    for t, w in zip(taus, weights, strict=True):
        agree = (torch.sign(t) == sign).logical_and_(t != 0)
        t.mul_(agree)
        den.add_(agree, alpha=w)
        del agree
    del sign
    num = taus.pop(0)
    while taus:
        num.add_(taus.pop())
    return b.add_(num.div_(den.masked_fill_(den == 0, 1.0)), alpha=scale)  # no agreeing entry: num is 0 there


def dare(load: Load, base: Load, weights: Sequence[float], *, density: float, generator: torch.Generator) -> Tensor:
    """DARE: random drop with rescale of each task vector, then task arithmetic.

    Args:
        load: Source loader of the fine-tuned models.
        base: Loader of the base tensor.
        weights: One weight per source.
        density: Keep probability ``1 - p`` of each entry, in ``(0, 1]``; kept entries are divided by it.
        generator: Source of the drop masks: source ``i``'s mask is the ``i``-th
            ``torch.rand(shape, generator=generator) < density`` draw.
    """
    out = base(0)
    b = out.clone()
    for i, w in enumerate(weights):
        tau = load(i).sub_(b)
        keep = torch.rand(tau.shape, generator=generator) < density
        out.add_(tau.mul_(keep), alpha=w / density)
        del tau, keep
    return out
