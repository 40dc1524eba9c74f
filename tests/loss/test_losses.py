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


def test_decoupled_ppo_hand_computed():
    # behaviour (sampler) and proximal (before-update) probabilities of the three sampled tokens
    behav = torch.log(torch.tensor([[0.5, 0.5, 0.1]]))
    prox = torch.log(torch.tensor([[0.6, 0.25, 0.8]]))
    # the current policy: ratios 1.5, 0.5, 1.1 to the proximal policy (as in test_ppo_clip_hand_computed)
    logp = (prox + torch.log(torch.tensor([[1.5, 0.5, 1.1]])))
    logp.requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    out = ppo_clip_loss(logp, behav, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2, clip_c=3.0,
                        prox_logp=prox, behav_cap=5.0)
    # clipped surrogates -1.2, 0.8, -2.2 weighted by pi_prox/pi_behav = 1.2, 0.5, 8 -> truncated at 5
    assert out.loss.item() == pytest.approx((-1.2 * 1.2 + 0.8 * 0.5 - 2.2 * 5.0) / 3, abs=1e-5)
    assert out.terms["diag/clip_frac"] == pytest.approx(2 / 3)
    assert out.terms["diag/behav_weight_mean"] == pytest.approx((1.2 + 0.5 + 8.0) / 3, abs=1e-5)
    assert out.terms["diag/behav_weight_max"] == pytest.approx(8.0, abs=1e-5)
    assert out.terms["diag/behav_trunc_frac"] == pytest.approx(1 / 3)
    # |log 1.2| + |log 0.5| + |log 8|, over three tokens
    assert out.terms["diag/behav_logp_gap"] == pytest.approx((0.18232 + 0.69315 + 2.07944) / 3, abs=1e-4)
    out.loss.backward()
    # only the unclipped token moves: d/dlogp of -A * w * r = -2 * 5 * 1.1, over 3 tokens
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -2 * 5.0 * 1.1 / 3], abs=1e-5)


@pytest.mark.parametrize(("cap", "kept", "expected", "clip_frac"), [
    (10.0, [1, 1, 1], (-1.2 * 1.2 + 0.8 * 0.5 - 2.2 * 8.0) / 3, 2 / 3),  # band [0.1, 10]: every weight in, untruncated
    (5.0, [1, 1, 0], (-1.2 * 1.2 + 0.8 * 0.5) / 2, 2 / 2),  # 8 > 5: the third token leaves the loss and its denominator
    (1.5, [1, 0, 0], (-1.2 * 1.2) / 1, 1 / 1),  # band [2/3, 1.5]: 0.5 leaves too
])
def test_masked_behaviour_weights_hand_computed(cap, kept, expected, clip_frac):
    """``behav_mode = "mask"``: the vectors of the test above; tokens outside [1/cap, cap] are dropped, not truncated."""
    behav = torch.log(torch.tensor([[0.5, 0.5, 0.1]]))
    prox = torch.log(torch.tensor([[0.6, 0.25, 0.8]]))
    logp = (prox + torch.log(torch.tensor([[1.5, 0.5, 1.1]]))).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    out = ppo_clip_loss(logp, behav, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2, clip_c=3.0,
                        prox_logp=prox, behav_cap=cap, behav_mode="mask")
    assert out.loss.item() == pytest.approx(expected, abs=1e-5)
    assert out.terms["diag/behav_trunc_frac"] == pytest.approx(kept.count(0) / 3)  # dropped, over every trained token
    assert out.terms["diag/behav_weight_mean"] == pytest.approx((1.2 + 0.5 + 8.0) / 3, abs=1e-5)
    assert out.terms["diag/clip_frac"] == pytest.approx(clip_frac)  # tokens 1 and 2 are clipped; over the kept ones
    out.loss.backward()
    # only the unclipped third token moves, and only while it is kept: -A * w * r = -2 * 8 * 1.1 over 3 tokens
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -2 * 8.0 * 1.1 / 3 if kept[2] else 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="behaviour-weight mode 'drop'"):
        ppo_clip_loss(logp, behav, adv, torch.ones(1, 3), prox_logp=prox, behav_mode="drop")


def test_decoupled_ppo_with_fresh_samples_is_ppo_clip():
    torch.manual_seed(1)
    old = -torch.rand(2, 5)
    adv, mask = torch.randn(2, 5), (torch.rand(2, 5) > 0.3).float()
    grads = []
    for prox in (None, old.clone()):
        logp = (old + 0.3 * torch.randn(2, 5, generator=torch.Generator().manual_seed(2))).requires_grad_()
        out = ppo_clip_loss(logp, old, adv, mask, prox_logp=prox)
        out.loss.backward()
        grads.append((out.loss.item(), logp.grad))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-7)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-7)
