"""``policy.rollout_dtype``: the bfloat16 rollout copy, the engine on it, and its distance from float32."""

from __future__ import annotations

import warnings

import pytest
import torch

from arborl.policy import token_logprobs
from arborl.rollout import ModelPolicy
from arborl.rollout import policy as policy_mod
from arborl.rollout.decoder import fast_forward, supports
from arborl.rollout.kvcache import BatchKVCache
from arborl.rollout.policy import cpu_has_native_bf16, rollout_model
from arborl.trajectory.schema import linearize

from .test_decoder import _qwen2
from .test_engine import _run, _specs


@pytest.fixture
def trained(model):
    """A private copy of the session model (these tests change its weights)."""
    import copy

    return copy.deepcopy(model)


def test_float32_is_the_model_itself(trained):
    assert rollout_model(trained, "float32") is trained
    with pytest.raises(ValueError, match="float16.*unknown"):
        rollout_model(trained, "float16")


def test_the_bf16_copy_has_bf16_weights_float32_buffers_and_follows_updates(trained):
    half = rollout_model(trained, "bfloat16")
    assert half is not trained and supports(half)  # the engine's own forward runs it
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in half.buffers() if b.is_floating_point()} == {torch.float32}  # rotary frequencies
    assert {p.dtype for p in trained.parameters()} == {torch.float32}  # the trained model is untouched
    assert not any(p.requires_grad for p in half.parameters())
    # an optimiser step on the trained model: the next call copies the new weights in (same copy object)
    opt = torch.optim.SGD(trained.parameters(), lr=0.5)
    trained.model.embed_tokens.weight.sum().backward()
    (trained.model.layers[0].mlp.down_proj.weight ** 2).sum().backward()
    opt.step()
    assert rollout_model(trained, "bfloat16") is half
    for mine, theirs in zip(half.parameters(), trained.parameters(), strict=True):
        assert torch.equal(mine, theirs.to(torch.bfloat16))
    # tied embeddings stay tied in the copy
    assert half.lm_head.weight is half.model.embed_tokens.weight


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fast_forward_of_the_bf16_copy_keeps_float32_attention_and_is_close(trained, tokenizer, arch):
    if arch == "qwen2":  # biased q/k/v projections, stacked in bf16 too
        trained = _qwen2(len(tokenizer))
    half = rollout_model(trained, "bfloat16")
    assert supports(half)
    ids = torch.randint(3, 20, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    pos = torch.arange(9).expand(3, 9)
    out = {}
    for name, m in (("fp32", trained), ("bf16", half)):
        cache = BatchKVCache()
        with torch.no_grad():
            out[name] = fast_forward(m, cache, ids, mask, pos).float()
        out[name + "_cache"] = cache.layers[0].keys.dtype
    assert out["bf16_cache"] == torch.float32 and out["fp32_cache"] == torch.float32
    gap = (out["bf16"] - out["fp32"]).abs().max().item()
    assert 0 < gap < 0.05, gap  # another precision: close, not equal


def test_bf16_rollout_logprobs_are_near_the_float32_models(trained, renderer):
    """The engine on the copy records bf16 behaviour log-probs; the trainer's float32 ones differ by a little."""
    eps = _run(ModelPolicy(rollout_model(trained, "bfloat16"), renderer), _specs([3, 3, 2, 3]), greedy=False)
    gaps = []
    for ep in eps:
        ep.validate()
        view = linearize(ep)
        with torch.no_grad():
            lp = token_logprobs(trained, torch.tensor([view.input_ids]))[0]
        m = torch.tensor(view.loss_mask, dtype=torch.bool)
        gaps.append((lp[m] - torch.tensor(view.logprobs)[m]).abs())
    gap = torch.cat(gaps)
    assert 0 < gap.mean().item() < 0.02 and gap.max().item() < 0.1, (gap.mean(), gap.max())


def test_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(info)
    info.write_text("flags\t\t: fpu avx2 amx_tile amx_bf16\n")
    assert cpu_has_native_bf16(info)
    info.write_text("flags\t\t: fpu avx2 avx512f avx512bw\n")
    assert not cpu_has_native_bf16(info)
    assert cpu_has_native_bf16(tmp_path / "missing")  # unknown: no warning


def test_a_cpu_without_native_bf16_is_warned_about(trained, monkeypatch):
    monkeypatch.setattr(policy_mod, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="AVX-512 BF16"):
        rollout_model(trained, "bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rollout_model(trained, "bfloat16")  # once per model: the copy is kept
