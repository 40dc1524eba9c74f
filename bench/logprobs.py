"""Full vs selective log-probs: one SFT-shaped training step (forward + backward) on the search recipe's model.

The model is ``examples/search_r1.toml``'s policy shape (Llama, hidden 96, 3 layers) over an
11,000-word vocabulary (the scratch tokenizer of the generated world); a batch of 16 episodes of
160 tokens of which 15 % are trained (the loss mask of an oracle Search-R1 episode). Prints the
median time per step of each path and the ratio.

    python bench/logprobs.py [--vocab 11000] [--batch 16] [--tokens 160] [--trained 0.15] [--reps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from arborl.policy import token_logprobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=11_000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--trained", type=float, default=0.15)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=256, max_position_embeddings=1024,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
    ids = torch.randint(0, a.vocab, (a.batch, a.tokens))
    mask = torch.ones_like(ids)
    trained = (torch.rand(a.batch, a.tokens) < a.trained).float()
    print(f"vocab {a.vocab}, batch {a.batch} x {a.tokens} tokens, {int(trained.sum())} trained, "
          f"{torch.get_num_threads()} threads")
    medians = {}
    for name, pos in (("full", None), ("selective", trained)):
        times = []
        for _ in range(a.reps + 1):
            t0 = time.perf_counter()
            lp = token_logprobs(model, ids, mask, positions=pos)
            (-(lp * trained).sum() / trained.sum()).backward()
            model.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        medians[name] = statistics.median(times[1:])  # the first is warm-up
        print(f"{name:>9}: {medians[name] * 1000:7.1f} ms / step")
    print(f"selective / full: {medians['selective'] / medians['full']:.2f}x")


if __name__ == "__main__":
    main()
