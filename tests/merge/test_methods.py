"""Merge methods on hand-made tensors, against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from arborl.merge import methods


def loader(*tensors: list[float]):
    """``load(i)``: a fresh float32 copy of the i-th list (the methods modify what they load)."""
    return lambda i: torch.tensor(tensors[i], dtype=torch.float32)


def test_linear_weights_one_zero_is_the_first_exactly():
    a = torch.randn(64, generator=torch.Generator().manual_seed(0))
    b = torch.randn(64, generator=torch.Generator().manual_seed(1))
    out = methods.linear(lambda i: (a, b)[i].clone(), [1.0, 0.0])
    assert torch.equal(out, a)


def test_linear_is_the_weighted_average():
    # (3 * [1, 2] + 1 * [5, 6]) / 4 = [8/4, 12/4]
    assert methods.linear(loader([1, 2], [5, 6]), [3.0, 1.0]).tolist() == [2.0, 3.0]


def test_slerp_half_way_between_orthogonal_tensors():
    # omega = pi/2, sin omega = 1: both coefficients are sin(pi/4) = sqrt(2)/2
    out = methods.slerp(loader([2, 0], [0, 1]), 0.5)
    h = math.sqrt(2) / 2
    assert out.tolist() == pytest.approx([2 * h, h], abs=1e-6)
    # a linear merge would give [1.0, 0.5]: slerp keeps the norm of unit-length sources
    unit = methods.slerp(loader([1, 0], [0, 1]), 0.5)
    assert unit.norm().item() == pytest.approx(1.0, abs=1e-6)


def test_slerp_ends_are_the_sources_and_parallel_tensors_interpolate_linearly():
    assert methods.slerp(loader([3, 4], [-1, 2]), 0.0).tolist() == pytest.approx([3, 4], abs=1e-6)
    assert methods.slerp(loader([3, 4], [-1, 2]), 1.0).tolist() == pytest.approx([-1, 2], abs=1e-6)
    assert methods.slerp(loader([1, 1], [2, 2]), 0.5).tolist() == pytest.approx([1.5, 1.5])


def test_task_arithmetic_adds_weighted_task_vectors():
    # tau1 = [1, 0, -1], tau2 = [0, 2, 0]; [1,1,1] + 1*tau1 + 0.5*tau2 = [2, 2, 0]
    out = methods.task_arithmetic(loader([2, 1, 0], [1, 3, 1]), loader([1, 1, 1]), [1.0, 0.5])
    assert out.tolist() == pytest.approx([2.0, 2.0, 0.0])


TAUS = ([3, -1, 0.5, -2], [-1, 2, 0.2, -4], [2, -3, -0.1, 1])


def test_ties_trims_elects_and_averages_the_agreeing_entries():
    # density 0.5 keeps 2 of 4 by magnitude: [3,0,0,-2], [0,2,0,-4], [2,-3,0,0]
    # elected sign of the sum [5,-1,0,-6]: +, -, 0, -
    # agreeing means: (3+2)/2, -3/1, none -> 0, (-2-4)/2
    base = [1, 1, 1, 1]
    models = [[b + t for b, t in zip(base, tau, strict=True)] for tau in TAUS]
    out = methods.ties(loader(*models), loader(base), [1.0, 1.0, 1.0], density=0.5)
    assert out.tolist() == pytest.approx([1 + 2.5, 1 - 3, 1 + 0, 1 - 3])


def test_ties_weights_and_scale():
    # weighted (2,1,1): [6,0,0,-4], [0,2,0,-4], [2,-3,0,0]; sum [8,-1,0,-8]
    # entry 0: (6+2)/(2+1); entry 1: -3/1; entry 3: (-4-4)/(2+1); scale 0.5 halves it
    out = methods.ties(loader(*TAUS), loader([0, 0, 0, 0]), [2.0, 1.0, 1.0], density=0.5, scale=0.5)
    assert out.tolist() == pytest.approx([0.5 * 8 / 3, 0.5 * -3, 0.0, 0.5 * -8 / 3])


def test_ties_at_density_one_with_agreeing_signs_is_the_mean_task_vector():
    out = methods.ties(loader([1, 2], [3, 4]), loader([0, 0]), [1.0, 1.0], density=1.0)
    assert out.tolist() == pytest.approx([2.0, 3.0])


def test_dare_drops_with_the_seeded_draw_and_rescales():
    # torch.rand(4) from seed 0 is [0.4963, 0.7682, 0.0885, 0.1320]: keep entries 0, 2, 3 at density 0.5,
    # each divided by 0.5
    assert torch.rand(4, generator=torch.Generator().manual_seed(0)).tolist() == pytest.approx(
        [0.4963, 0.7682, 0.0885, 0.1320], abs=1e-4)
    out = methods.dare(loader([1, 2, 3, 4]), loader([0, 0, 0, 0]), [1.0], density=0.5,
                       generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [2.0, 0.0, 6.0, 8.0]


def test_dare_second_model_uses_the_next_draw_and_its_weight():
    # the first mask is draw 1 ([T, F, T, T]); the second is draw 2 of the same generator
    gen = torch.Generator().manual_seed(0)
    torch.rand(4, generator=gen)
    second = (torch.rand(4, generator=gen) < 0.5).float()
    out = methods.dare(loader([1, 2, 3, 4], [10, 10, 10, 10]), loader([0, 0, 0, 0]), [1.0, 0.5], density=0.5,
                       generator=torch.Generator().manual_seed(0))
    expected = torch.tensor([2.0, 0.0, 6.0, 8.0]) + 0.5 * 20.0 * second
    assert out.tolist() == expected.tolist()


def test_dare_is_unbiased_and_density_one_is_task_arithmetic():
    tau = [1.0, -2.0, 3.0]
    mean = sum(methods.dare(loader(tau), loader([0, 0, 0]), [1.0], density=0.3,
                            generator=torch.Generator().manual_seed(s)) for s in range(4000)) / 4000
    assert mean.tolist() == pytest.approx(tau, abs=0.1)
    full = methods.dare(loader([2, 1], [1, 3]), loader([1, 1]), [1.0, 0.5], density=1.0,
                        generator=torch.Generator().manual_seed(0))
    assert full.tolist() == methods.task_arithmetic(loader([2, 1], [1, 3]), loader([1, 1]), [1.0, 0.5]).tolist()
