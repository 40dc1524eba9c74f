"""SFT steps and RL iterations of a Qwen2.5-0.5B-shaped policy on the trainer's device: tokens/s and peak memory.

Builds the model from a config (random weights, Qwen2.5-0.5B's shape and 151,936-token
vocabulary), wraps it in a LoRA adapter, turns on bf16 autocast and gradient checkpointing
(``policy.lora_rank``, ``policy.autocast``, ``policy.gradient_checkpointing``), and puts it on
``--device`` (``auto``: CUDA when present; ``policy.device``). Then it runs what the trainer runs:

* ``--sft-steps`` SFT steps (the trainer's masked log-likelihood on random token rows);
* ``--rl-iters`` RL iterations, each: sample ``--episodes`` turns of ``--new-tokens`` tokens with
  the kept-cache engine (behaviour log-probs recorded), then one PPO-clip step on them with
  advantages +-1, the recorded behaviour log-probs as ``old_logp``.

It prints tokens/s of SFT, of sampling and of the PPO update, and the peak memory (CUDA: peak
allocated; CPU: peak RSS of the process). ``--tiny`` shrinks the model to a few layers of small
width so the same code runs on a CPU in seconds (the CI check of this script).

Usage: ``python bench/gpu.py [--device auto] [--tiny]``
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from arborl.loss import ppo_clip_loss, sft_loss
from arborl.policy import token_logprobs, token_logprobs_and_entropy
from arborl.policy.model import ATTN_IMPLEMENTATION, add_lora, resolve_device, set_training_options
from arborl.rollout.config import SamplingConfig
from arborl.rollout.generate import LMSession, TurnRequest

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)
TINY = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


def build(shape: dict, device: torch.device, lora_rank: int) -> torch.nn.Module:
    """The policy as the trainer sets it up: random weights, LoRA, bf16 autocast, gradient checkpointing."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), attn_implementation=ATTN_IMPLEMENTATION)
    model = add_lora(model.float(), rank=lora_rank) if lora_rank else model.float()
    return set_training_options(model, gradient_checkpointing=True, autocast="bf16").to(device).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sft(model, opt, device: torch.device, vocab: int, steps: int, rows: int, seq: int) -> float:
    """``steps`` SFT steps on random ``[rows, seq]`` batches; returns trained tokens per second."""
    gen = torch.Generator().manual_seed(1)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        ids = torch.randint(0, vocab, (rows, seq), generator=gen).to(device)
        mask = torch.ones(rows, seq, device=device)
        mask[:, 0] = 0
        out = sft_loss(token_logprobs(model, ids, positions=mask), mask)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
    _sync(device)
    return steps * rows * (seq - 1) / (time.perf_counter() - t0)


def rl_iteration(model, opt, device: torch.device, vocab: int, episodes: int, prompt: int, new: int,
                 gen: torch.Generator) -> tuple[float, float, int]:
    """Sample ``episodes`` turns, then one PPO-clip step on them; returns (sampling s, update s, sampled tokens)."""
    prompts = torch.randint(1, vocab, (episodes, prompt), generator=gen).tolist()
    session = LMSession(model, end_token_ids=[0], pad_token_id=0, sampling=SamplingConfig(max_new_tokens=new),
                        generator=gen)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        outs = session.generate([TurnRequest(slot=i, prompt_ids=p, max_new_tokens=new) for i, p in enumerate(prompts)])
    _sync(device)
    t_sample = time.perf_counter() - t0
    width = prompt + max(len(o.ids) for o in outs)
    ids = torch.zeros(episodes, width, dtype=torch.long)
    att, mask, old = torch.zeros_like(ids), torch.zeros(episodes, width), torch.zeros(episodes, width)
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        n = len(p) + len(o.ids)
        ids[i, :n] = torch.tensor(p + o.ids)
        att[i, :n] = 1
        mask[i, len(p):n] = torch.tensor(o.mask, dtype=torch.float32)
        old[i, len(p):n] = torch.tensor(o.logprobs)
    ids, att, mask, old = ids.to(device), att.to(device), mask.to(device), old.to(device)
    adv = torch.where(torch.arange(episodes, device=device)[:, None] % 2 == 0, 1.0, -1.0) * mask
    t0 = time.perf_counter()
    logp, ent = token_logprobs_and_entropy(model, ids, att, positions=mask, entropy_grad=False)
    out = ppo_clip_loss(logp, old, adv, mask, entropy=ent)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    _sync(device)
    return t_sample, time.perf_counter() - t0, int(mask.sum())


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the process's peak RSS on a CPU (MB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print its table and return its figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    ap.add_argument("--tiny", action="store_true", help="a small model of the same kind (CPU check)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--sft-steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rl-iters", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if args.tiny:
        args.seq, args.prompt, args.new_tokens, args.episodes, args.rows = 32, 16, 8, 4, 2
    device = resolve_device(args.device)
    shape = TINY if args.tiny else QWEN25_05B
    model = build(shape, device, args.lora_rank)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    sft_tps = sft(model, opt, device, shape["vocab_size"], args.sft_steps, args.rows, args.seq)
    gen = torch.Generator().manual_seed(2)
    sample_s = update_s = 0.0
    tokens = 0
    for _ in range(args.rl_iters):
        s, u, n = rl_iteration(model, opt, device, shape["vocab_size"], args.episodes, args.prompt, args.new_tokens, gen)
        sample_s, update_s, tokens = sample_s + s, update_s + u, tokens + n
    figures = {"sft_tokens_per_s": sft_tps, "sample_tokens_per_s": tokens / sample_s,
               "update_tokens_per_s": tokens / update_s, "peak_memory_mb": peak_memory_mb(device)}
    name = "tiny Qwen2-shaped" if args.tiny else "Qwen2.5-0.5B-shaped (random weights, vocab 151,936)"
    print(f"{name} on {device}, LoRA rank {args.lora_rank}, bf16 autocast, gradient checkpointing")
    for k, v in figures.items():
        print(f"{k:<24}{v:>14.1f}")
    return figures


if __name__ == "__main__":
    main()
