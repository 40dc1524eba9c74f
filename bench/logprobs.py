"""Full vs selective log-probs: one SFT/PPO-shaped training step (forward + backward) of a policy.

Three paths over the same batch: ``full`` (every position's logits), ``head only`` (the model body
over every column, the output layer at the trained tokens' predecessors only) and ``selective``
(the default: also the last decoder layer only there, :mod:`arborl.policy.tail`). Two shapes:

* ``--shape search`` (default): ``examples/search_r1.toml``'s policy (Llama, hidden 96, 3 layers)
  over an 11,000-word vocabulary, 16 episodes of 160 tokens, 15 % trained (an oracle
  Search-R1 episode's loss mask);
* ``--shape demo``: the FrozenLake demo's policy (hidden 256, 2 layers, MLP 688, 64 words),
  a micro-batch of 8 episodes of 128 tokens, 10 % trained (the demo's RL batches train 401 of
  3,879 tokens).

With ``--group G --prompt P`` the rows come in groups of ``G`` that share their first ``P`` tokens
(a GRPO group's prompt, a trunk and its branches), and a fourth path runs: ``prefix-shared``
(``rl.prefix_share``: one pass over the batch's prefix tree, :mod:`arborl.policy.packed`, in the
pack size its cost estimate picks).

Prints the median time per step of each path and the ratios to ``full``.

    python bench/logprobs.py [--shape search|demo] [--vocab V] [--batch B] [--tokens T] [--trained F] [--reps 10]
                             [--group G --prompt P]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from arborl.policy import packed, tail, token_logprobs

SHAPES = {
    "search": dict(vocab=11_000, hidden=96, layers=3, mlp=256, batch=16, tokens=160, trained=0.15),
    "demo": dict(vocab=64, hidden=256, layers=2, mlp=688, batch=8, tokens=128, trained=0.10),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="search")
    for k in ("vocab", "batch", "tokens"):
        ap.add_argument(f"--{k}", type=int)
    ap.add_argument("--trained", type=float)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--group", type=int, default=1, help="rows per group sharing a prompt (1: no sharing)")
    ap.add_argument("--prompt", type=int, default=0, help="tokens a group's rows share")
    a = ap.parse_args()
    s = {k: v if getattr(a, k, None) is None else getattr(a, k) for k, v in SHAPES[a.shape].items()}
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                      num_attention_heads=4, num_key_value_heads=4, intermediate_size=s["mlp"],
                      max_position_embeddings=1024, tie_word_embeddings=True)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
    ids = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]))
    if a.group > 1:  # each group's rows start with the group's first row's prompt
        for start in range(0, s["batch"], a.group):
            ids[start:start + a.group, : a.prompt] = ids[start, : a.prompt]
    mask = torch.ones_like(ids)
    trained = (torch.rand(s["batch"], s["tokens"]) < s["trained"]).float()
    print(f"shape {a.shape}: vocab {s['vocab']}, hidden {s['hidden']}, {s['layers']} layers, batch {s['batch']} x "
          f"{s['tokens']} tokens, {int(trained.sum())} trained, {torch.get_num_threads()} threads"
          + (f", groups of {a.group} sharing {a.prompt} tokens" if a.group > 1 else ""))
    paths = [("full", None, False), ("head only", trained, False), ("selective", trained, True)]
    if a.group > 1:
        paths.append(("prefix-shared", trained, True))
    pack = packed.best_pack_tokens(model, ids, mask, 512)[0]
    medians = {}
    for name, pos, last_layer_tail in paths:
        tail.ENABLED = last_layer_tail
        times = []
        for _ in range(a.reps + 1):
            t0 = time.perf_counter()
            if name == "prefix-shared":
                lp = packed.packed_token_logprobs_and_entropy(model, ids, mask, positions=pos, entropy_grad=False,
                                                              pack_tokens=pack)[0]
            else:
                lp = token_logprobs(model, ids, mask, positions=pos)
            (-(lp * trained).sum() / trained.sum()).backward()
            model.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        medians[name] = statistics.median(times[1:])  # the first is warm-up
        print(f"{name:>13}: {medians[name] * 1000:7.1f} ms / step, {medians[name] / medians['full']:.2f}x of full")
    tail.ENABLED = True


if __name__ == "__main__":
    main()
