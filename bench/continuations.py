"""Continuations from a trunk's kept KV cache against prefilling the shared prefix again.

Loads a policy, rolls out ``--tasks`` FrozenLake maps x ``--group`` rollouts (the trunks), then
the branch rollouts of ``rl.branch`` (every untried action at every visited state) and the tree
rollouts of ``rl.tree`` (``--tree-k`` continuations of ``--tree-nodes`` turns per group), each
once from the trunks' kept caches (:class:`~arborl.rollout.kvcache.PrefixCache`) and once
prefilling the shared prefix with the first prompt (``prefix_cache=None``). Prints seconds and
the prefix tokens taken from kept rows / prefilled. Same seeds, so both runs continue the same
turns.

Usage: ``python bench/continuations.py POLICY_DIR [--tasks 16] [--group 4] [--threads 1]``
"""

from __future__ import annotations

import argparse
import time

import torch

from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, load_policy
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.branch import branch_specs
from arborl.rollout.kvcache import PrefixCache
from arborl.rollout.tree import tree_specs


def _env() -> FrozenLake:
    return FrozenLake(size=4, obs_format="rows+cols", progress_reward=0.1)


def main() -> None:
    """Run the comparison and print one row per (kind, cache)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("policy")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tree-k", type=int, default=2)
    ap.add_argument("--tree-nodes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.policy)
    policy = ModelPolicy(model.eval(), ChatRenderer(tok, None))
    cfg = RolloutConfig(max_turns=10, invalid_action_penalty=-1.0, sampling=SamplingConfig(max_new_tokens=4))
    greedy = RolloutConfig(max_turns=10, invalid_action_penalty=-1.0,
                           sampling=SamplingConfig(max_new_tokens=4, greedy=True))
    specs = [EpisodeSpec(task_id=f"m{s}", task_type="frozenlake", group_id=f"g{s}", seed=s)
             for s in range(args.tasks) for _ in range(args.group)]
    kinds = {
        "branch": (lambda trunks: branch_specs(trunks, FrozenLake.actions), greedy),
        "tree": (lambda trunks: tree_specs(trunks, k=args.tree_k, nodes=args.tree_nodes, select="uniform",
                                           generator=torch.Generator().manual_seed(1)), cfg),
    }
    print(f"{'continuations':<14} {'cache':<8} {'episodes':>8} {'seconds':>8} {'reused':>8} {'prefilled':>10}")
    for kind, (make_specs, ccfg) in kinds.items():
        for use_cache in (True, False):
            kept = PrefixCache() if use_cache else None
            trunks = run_episodes(policy, _env, specs, cfg, generator=torch.Generator().manual_seed(0),
                                  prefix_cache=kept)
            cont = make_specs(trunks)
            t0 = time.perf_counter()
            run_episodes(policy, _env, cont, ccfg, generator=torch.Generator().manual_seed(2), prefix_cache=kept)
            dt = time.perf_counter() - t0
            shared = sum(len(t.prompt_ids) + len(t.output_ids) for s in cont for t in s.prefix)
            reused = kept.reused_tokens if kept else 0
            print(f"{kind:<14} {'kept' if use_cache else 'prefill':<8} {len(cont):>8} {dt:>8.2f} {reused:>8} "
                  f"{shared - reused:>10}")


if __name__ == "__main__":
    main()
