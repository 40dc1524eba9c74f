"""HTTP overhead: FrozenLake rollouts through ``arborl serve`` against the in-process engine.

Builds the FrozenLake recipe's policy (examples/frozenlake.toml: its tokenizer and model shape,
random weights; throughput does not depend on what the weights learnt), then runs the same
episodes, greedy so every backend does the same work (greedy HTTP episodes equal in-process ones,
tests/serve/test_http_policy.py), three ways:

* ``in-process``: ``run_episodes`` with ``ModelPolicy`` (batched decoding, KV cache kept across turns).
* ``arborl serve (thread)``: ``HTTPPolicy`` against a ``PolicyServer`` in this process.
* ``arborl serve (process)``: ``HTTPPolicy`` against an ``arborl serve`` subprocess.

Prints episodes/s, generated tokens/s and each row's wall time as a ratio to the in-process one.
What the ratio measures: HTTP and JSON per turn, plus what ``arborl serve`` does not do (it
does not batch concurrent requests and prefills an episode's whole history each turn, where the engine
batches all live episodes and keeps their caches).

Usage: ``python bench/serve.py [--episodes 32] [--threads 1]``
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from arborl.config import load_config
from arborl.policy import ChatRenderer, load_policy
from arborl.rollout import ModelPolicy, run_episodes
from arborl.rollout.http_policy import HTTPPolicy
from arborl.serve import PolicyServer, ServedModel
from arborl.train.common import env_factory, task_type_of
from arborl.train.config import TrainConfig
from arborl.train.stages import prepare_policy, specs_for

ROOT = Path(__file__).resolve().parents[1]


def _run(policy, make_env, specs, cfg) -> tuple[float, int, list]:
    t0 = time.perf_counter()
    eps = run_episodes(policy, make_env, specs, cfg.rollout, generator=torch.Generator().manual_seed(0))
    wall = time.perf_counter() - t0
    tokens = sum(sum(t.output_mask) for e in eps for t in e.turns)
    return wall, tokens, eps


def _outputs(eps) -> list:
    return [[t.output_ids for t in e.turns] for e in eps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run_dir = tempfile.mkdtemp(prefix="arborl-bench-serve-")
    cfg = load_config(TrainConfig, ROOT / "examples" / "frozenlake.toml",
                      [f'run_dir="{run_dir}"', "rollout.sampling.greedy=true"])
    make_env = env_factory(cfg.env)
    ckpt = prepare_policy(cfg, make_env)
    model, tok = load_policy(ckpt)
    renderer = ChatRenderer(tok, cfg.policy.system_prompt or None)
    env = make_env()
    specs = specs_for(cfg, task_type_of(env), list(range(args.episodes)))
    env.close()
    rows = [("in-process", *_run(ModelPolicy(model, renderer), make_env, specs, cfg))]
    with PolicyServer(ServedModel(ckpt, device="cpu")) as server:
        rows.append(("arborl serve (thread)", *_run(HTTPPolicy([server.url], renderer), make_env, specs, cfg)))
    cmd = [sys.executable, "-m", "arborl.cli", "serve", str(ckpt), "--port", "0", "--device", "cpu",
           "--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://\S+)/v1", proc.stdout.readline()).group(1)
        rows.append(("arborl serve (process)", *_run(HTTPPolicy([url], renderer), make_env, specs, cfg)))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    base_wall, _, base_eps = rows[0][1:]
    same = all(_outputs(r[3]) == _outputs(base_eps) for r in rows[1:])
    turns = sum(len(e.turns) for e in base_eps)
    print(f"FrozenLake recipe policy, {args.episodes} greedy episodes ({turns} turns), torch threads {args.threads}, "
          f"rollout.batch_size {cfg.rollout.batch_size}; same outputs on every backend: {same}")
    print(f"{'backend':<24}{'wall s':>9}{'episodes/s':>12}{'tokens/s':>10}{'x in-process':>14}")
    for name, wall, tokens, _ in rows:
        print(f"{name:<24}{wall:>9.2f}{args.episodes / wall:>12.1f}{tokens / wall:>10.0f}{wall / base_wall:>14.2f}")


if __name__ == "__main__":
    main()
