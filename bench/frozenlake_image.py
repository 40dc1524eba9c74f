"""Is the cross-turn image context used? Held-out success with earlier images kept and dropped.

Evaluates the policies of an image-FrozenLake run (``examples/frozenlake_image.toml``) greedily on
the run's held-out maps twice: as trained (every earlier turn's image stays in the model's input)
and with earlier turns' images replaced by blank pictures (``drop_earlier_images``: only the
current turn's image is seen). With ``map_turns = "first"`` the lake is drawn in turn 1 only, so
a policy that uses the turn-1 image at later turns loses success when it is dropped.

Usage: ``python bench/frozenlake_image.py RUN_DIR [--episodes 256] [--policies sft,rl]``; prints a
table and writes ``RUN_DIR/image_ablation.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from arborl.api import load_config
from arborl.policy import ChatRenderer, load_policy
from arborl.rollout import ModelPolicy, run_episodes
from arborl.rollout.media import MemoryMedia
from arborl.train.common import env_factory, task_type_of
from arborl.train.stages import specs_for


def success(run_dir: Path, name: str, episodes: int, *, drop: bool) -> float:
    """Greedy held-out success of ``run_dir/policy/name``, earlier images kept or dropped."""
    cfg = load_config(run_dir / "config.toml")
    model, tok = load_policy(run_dir / "policy" / name)
    make_env = env_factory(cfg.env)
    env = make_env()
    task_type = task_type_of(env)
    env.close()
    rcfg = replace(cfg.rollout, sampling=replace(cfg.rollout.sampling, greedy=True))
    policy = ModelPolicy(model, ChatRenderer(tok, cfg.policy.system_prompt or None), reuse_cache=not drop,
                         drop_earlier_images=drop, num_threads=1)
    seeds = [cfg.env.eval_seed_start + k for k in range(episodes)]
    eps = run_episodes(policy, make_env, specs_for(cfg, task_type, seeds, group_prefix="ablation"), rcfg,
                       generator=torch.Generator().manual_seed(cfg.seed + 7), media=MemoryMedia())
    return sum(1.0 for e in eps if e.success) / len(eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--policies", default="sft,rl")
    args = ap.parse_args()
    rows = {}
    for name in args.policies.split(","):
        rows[name] = {"kept": success(args.run_dir, name, args.episodes, drop=False),
                      "dropped": success(args.run_dir, name, args.episodes, drop=True)}
    print(f"{'policy':8} {'earlier images kept':>20} {'earlier images dropped':>23}   ({args.episodes} held-out maps)")
    for name, r in rows.items():
        print(f"{name:8} {r['kept']:>20.3f} {r['dropped']:>23.3f}")
    (args.run_dir / "image_ablation.json").write_text(json.dumps({"episodes": args.episodes, **rows}, indent=1))


if __name__ == "__main__":
    main()
