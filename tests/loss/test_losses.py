"""Loss functions: hand-computed values and the masked-token zero-gradient invariant."""

import pytest
import torch

from arborl.loss import aggregate, kl_estimate, ppo_clip_loss, sft_loss


def test_aggregate_modes_hand_computed():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert aggregate(v, m, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(v, m, "seq-mean-token-sum-norm").item() == pytest.approx(7 / (2 * 3))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(v, m, "mean")


def test_ppo_clip_hand_computed():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    out = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    # token0: A>0, ratio 1.5 clipped to 1.2 -> -1.2 ; token1: A<0, ratio .5 -> max(0.5, 0.8)=0.8
    # token2: ratio 1.1 in range -> -2.2
    assert out.loss.item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3, abs=1e-6)
    assert out.terms["diag/clip_frac"] == pytest.approx(2 / 3)


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere():
    a = torch.tensor([-1.0, -2.0])
    assert torch.allclose(kl_estimate(a, a, "k3"), torch.zeros(2))
    assert (kl_estimate(a, a - 0.5, "k3") > 0).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_masked_logits_get_exactly_zero_gradient(agg):
    torch.manual_seed(0)
    b, t, v = 3, 7, 11
    logits = torch.randn(b, t, v, requires_grad=True)
    tokens = torch.randint(0, v, (b, t))
    mask = (torch.rand(b, t) > 0.5).float()
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    ref = logp.detach() - 0.1
    out = ppo_clip_loss(logp, logp.detach() + 0.05, torch.randn(b, t), mask, agg=agg,
                        ref_logp=ref, kl_coef=0.1, entropy=-(logp * 0), entropy_coef=0.01)
    (out.loss + sft_loss(logp, mask).loss).backward()
    g = logits.grad
    assert torch.count_nonzero(g[mask == 0]) == 0
    assert torch.count_nonzero(g[mask == 1]) > 0
