"""Activation memory of one RL training forward on a Qwen2.5-0.5B-shaped model: plain, checkpointed, bf16.

Builds the model from a config (random weights, Qwen2.5-0.5B's shape and 151,936-token
vocabulary), runs the trainer's log-prob forward (``token_logprobs``) on one sequence of
``--tokens`` tokens with gradients, and counts the bytes autograd saves for the backward pass
(``torch.autograd.graph.saved_tensors_hooks``): the activation memory the update holds at its
peak, independent of allocator noise on a shared machine. Prints bytes per token for each
option of ``arborl.policy.model.set_training_options``.

Usage: ``python bench/train_memory.py [--tokens 128]``
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from arborl.policy import token_logprobs
from arborl.policy.model import ATTN_IMPLEMENTATION, set_training_options

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)


def _measure(options: dict, tokens: int) -> tuple[float, float]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_05B), attn_implementation=ATTN_IMPLEMENTATION)
    model = set_training_options(model.float().eval(), **options)
    ids = torch.randint(0, QWEN25_05B["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = token_logprobs(model, ids).sum()
    loss.backward()
    return saved[0] / tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    print(f"Qwen2.5-0.5B-shaped model (random weights), one sequence of {args.tokens} tokens, forward + backward")
    print(f"{'options':<40}{'saved MB/token':>16}{'x plain':>9}{'fwd+bwd s':>11}")
    rows = [("plain (float32)", {}), ("gradient_checkpointing", {"gradient_checkpointing": True}),
            ("autocast bf16", {"autocast": "bf16"}),
            ("both", {"gradient_checkpointing": True, "autocast": "bf16"})]
    base = None
    for name, options in rows:
        per_token, secs = _measure(options, args.tokens)
        base = base or per_token
        print(f"{name:<40}{per_token / 2**20:>16.2f}{per_token / base:>9.2f}{secs:>11.1f}")


if __name__ == "__main__":
    main()
