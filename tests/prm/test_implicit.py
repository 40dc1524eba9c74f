"""The implicit PRMs: PRIME's per-token reward exactly, what training changes, iStar's DPO loss."""

import copy

import pytest
import torch
from conftest import context, lake_context, success_gap, with_rl

from arborl.config import ConfigError
from arborl.policy import token_logprobs
from arborl.prm.implicit import ImplicitPRM
from arborl.store import open_store


def perturbed(prm, seed=0):
    """Move pi_phi off its reference (a fresh copy equals it, so every reward would be 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in prm.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return prm


def test_prime_token_reward_is_exactly_beta_times_the_log_ratio(lake):
    cfg, policy, tok, url, episodes = lake
    prm = perturbed(ImplicitPRM(with_rl(cfg, prm_beta=0.3), policy, tok, objective="ce", reference="frozen"))
    with open_store(url) as store:
        ctx = context(cfg, policy, tok, store, episodes)
    b = ctx.batch
    with torch.no_grad():
        phi = token_logprobs(prm.model, b.input_ids, b.attention_mask)
        ref = token_logprobs(policy, b.input_ids, b.attention_mask)  # the start policy is the frozen reference
    expected = 0.3 * (phi - ref) * b.loss_mask
    got = prm.token_rewards(b)
    assert expected.abs().max() > 1e-3  # not trivially zero
    assert torch.allclose(got, expected, atol=1e-6)
    # the step reward is the sum over the turn's trained tokens, the last token included
    steps = prm.step_inputs(ctx)["step_scores"]
    by_hand = torch.zeros(ctx.steps.episode.numel())
    for i in range(b.input_ids.shape[0]):
        for t in range(b.input_ids.shape[1]):
            if b.step_of_token[i, t] >= 0:
                by_hand[b.step_of_token[i, t]] += expected[i, t]
    assert torch.allclose(steps, by_hand, atol=1e-5)


def test_istar_reference_is_the_behaviour_log_probs(lake):
    cfg, policy, tok, url, episodes = lake
    prm = ImplicitPRM(cfg, policy, tok, objective="dpo", reference="behaviour")
    assert prm.ref is None
    with open_store(url) as store:
        b = context(cfg, policy, tok, store, episodes).batch
    with torch.no_grad():
        phi = token_logprobs(prm.model, b.input_ids, b.attention_mask)
    assert torch.allclose(prm.token_rewards(b), cfg.rl.prm_beta * (phi - b.old_logp) * b.loss_mask, atol=1e-6)


def test_a_fresh_prime_model_gives_zero_rewards_and_training_changes_it(lake):
    cfg, ctx = lake_context(lake, prm_lr=3e-3, prm_epochs=4, prm_minibatch_size=8, prm_beta=0.5)
    policy = ctx.policy
    prm = ImplicitPRM(cfg, policy, ctx.tok, objective="ce", reference="frozen")
    before = prm.step_inputs(ctx)["step_scores"]
    weights = copy.deepcopy(prm.model.state_dict())
    assert before.abs().max() < 1e-5  # pi_phi = pi_ref
    metrics = prm.fit(ctx)
    after = prm.step_inputs(ctx)["step_scores"]
    assert metrics["prm/updates"] > 0
    assert any(not torch.equal(weights[k], v) for k, v in prm.model.state_dict().items())
    assert after.abs().max() > 1e-3
    assert success_gap(after, ctx) > 0, success_gap(after, ctx)
    # the frozen reference did not move
    assert all(torch.equal(a, b) for a, b in zip(prm.ref.state_dict().values(), policy.state_dict().values(), strict=True))


def test_the_ce_loss_reaches_every_parameter_of_the_reward_model(lake):
    # iStar's released code detaches q before its loss, so its reward model never trains
    cfg, policy, tok, url, episodes = lake
    for objective in ("ce", "dpo"):
        prm = perturbed(ImplicitPRM(cfg, policy, tok, objective=objective, reference="frozen"))
        with open_store(url) as store:
            ctx = context(cfg, policy, tok, store, episodes)
        rows = torch.arange(len(episodes))
        if objective == "ce":
            outcomes = torch.tensor([float(bool(e.success)) for e in episodes])
            loss = prm.ce_loss(ctx.batch, ctx.steps, rows, outcomes)
        else:
            loss, n = prm.dpo_loss(ctx.batch, ctx.steps, rows)
            assert n > 0
        loss.backward()
        grads = [p.grad for p in prm.model.parameters() if p.requires_grad]
        assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0


def test_istar_dpo_loss_decreases_on_a_fixed_pair_set(lake):
    cfg, ctx = lake_context(lake, prm_lr=1e-3, prm_epochs=1, prm_minibatch_size=64, prm_beta=0.5)
    prm = ImplicitPRM(cfg, ctx.policy, ctx.tok, objective="dpo", reference="behaviour")
    rows = torch.arange(len(ctx.episodes))
    losses, pairs = [], []
    for _ in range(6):
        with torch.no_grad():
            loss, n = prm.dpo_loss(ctx.batch, ctx.steps, rows)
        losses.append(float(loss))
        pairs.append(n)
        prm.fit(ctx)
    # pairs: every (better, worse) of a group, i.e. the groups with both a success and a failure
    by_hand = 0
    for g in ctx.steps.group.unique():
        s = ctx.steps.score[ctx.steps.group == g]
        by_hand += int((s[:, None] > s[None, :]).sum())
    assert pairs == [by_hand] * 6 and by_hand > 0
    assert losses[-1] < losses[0] - 0.05, losses


def test_a_group_without_a_pair_gives_no_loss_and_no_update(lake):
    cfg, policy, tok, url, episodes = lake
    prm = ImplicitPRM(cfg, policy, tok, objective="dpo", reference="behaviour")
    won = [e for e in episodes if e.success]
    with open_store(url) as store:
        ctx = context(cfg, policy, tok, store, won)
    weights = copy.deepcopy(prm.model.state_dict())
    assert prm.fit(ctx) == {**prm.last_scores, "prm/loss": 0.0, "prm/updates": 0.0, "prm/pairs": 0.0}
    assert all(torch.equal(weights[k], v) for k, v in prm.model.state_dict().items())


def test_unknown_objective_is_refused(lake):
    cfg, policy, tok, _, _ = lake
    with pytest.raises(ConfigError, match="objective"):
        ImplicitPRM(cfg, policy, tok, objective="ppo")
