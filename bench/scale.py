"""Scale-out: rollout throughput with Ray env workers, and generation through ``arborl serve``.

1. Env- and tool-bound: the code-agent recipe (examples/code_agent.toml: every turn of the
   expert runs the model-written program in the sandbox) rolled out by its expert, a scripted
   policy, so generation costs nothing and the table measures the env side alone. The same
   episodes run on the single-process engine (``rollout.env_workers`` = 8 threads) and on 1, 2 and 4
   Ray env worker actors of a Ray instance this script starts (``cluster.address = "local"``),
   each running 1 or 8 env calls at once (``cluster.env_worker_threads``).
   Prints episodes/s, env steps/s and each row's throughput as a ratio to the single-process one,
   and whether every row produced the same episodes.
2. FrozenLake through ``arborl serve`` against in-process generation: ``bench/serve.py`` (run as
   it is, its table printed here).

What the ratios measure. The single-process engine already steps a turn's envs on threads, and a
sandboxed program runs in its own process, so threads overlap tool calls too; actors add
process-level parallelism for the Python side of the env (parsing, test harness, reward) and
let envs run on other machines. An actor with one thread steps its envs one at a time, so
1 worker x 1 thread is the serial baseline. On a machine with few cores the figures are bounded by those cores.

Usage: ``python bench/scale.py [--episodes 32] [--workers 1,2,4] [--worker-threads 1,8] [--serve-episodes 32]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from arborl.cluster import ClusterConfig, connect, start_env_workers
from arborl.config import load_config
from arborl.policy import ChatRenderer, train_tokenizer
from arborl.rollout import ScriptedPolicy, run_episodes
from arborl.train.common import env_factory, task_type_of
from arborl.train.config import TrainConfig
from arborl.train.stages import specs_for

ROOT = Path(__file__).resolve().parents[1]


def _view(eps) -> list:
    return [(e.stop_reason, e.rewards, [(t.action_text, t.result, t.reward) for t in e.turns]) for e in eps]


def _rollout(make_env, specs, cfg, renderer) -> tuple[float, list]:
    policy = ScriptedPolicy(lambda env: env.expert_action(), renderer)
    t0 = time.perf_counter()
    eps = run_episodes(policy, make_env, specs, cfg.rollout, generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - t0, eps


def env_rows(episodes: int, worker_counts: list[int], threads: list[int]) -> list[tuple[str, float, list]]:
    """(label, wall seconds, episodes) of the code recipe on one process, then on each worker count."""
    cfg = load_config(TrainConfig, ROOT / "examples" / "code_agent.toml", [f'run_dir="{tempfile.mkdtemp()}"'])
    make_env = env_factory(cfg.env)
    env = make_env()
    specs = specs_for(cfg, task_type_of(env), list(range(episodes)))
    env.close()
    renderer = ChatRenderer(train_tokenizer(["the code agent bench"]), None)
    _rollout(make_env, specs[:4], cfg, renderer)  # warm the sandbox (first start is slower)
    rows = [("single process", *_rollout(make_env, specs, cfg, renderer))]
    with connect(ClusterConfig(address="local", object_store_mb=100)) as ray:
        for t, n in [(t, n) for t in threads for n in worker_counts]:
            workers = start_env_workers(ray, ClusterConfig(address="local", env_workers=n, env_worker_cpus=0.01,
                                                           env_worker_threads=t), cfg.env)
            _rollout(workers.make, specs[:n], cfg, renderer)  # each worker's sandbox started before timing
            rows.append((f"ray, {n} worker{'s' * (n > 1)} x {t} thread{'s' * (t > 1)}",
                         *_rollout(workers.make, specs, cfg, renderer)))
            for actor in workers.actors:
                ray.kill(actor, no_restart=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--worker-threads", default="1,8", help="cluster.env_worker_threads values to run")
    ap.add_argument("--serve-episodes", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = env_rows(args.episodes, [int(n) for n in args.workers.split(",")],
                    [int(t) for t in args.worker_threads.split(",")])
    base_wall, base_eps = rows[0][1:]
    same = all(_view(eps) == _view(base_eps) for _, _, eps in rows[1:])
    steps = sum(len(e.turns) for e in base_eps)
    print(f"code-agent recipe, {args.episodes} expert episodes ({steps} env steps, sandboxed tool calls); "
          f"same episodes on every row: {same}")
    print(f"{'engine':<28}{'wall s':>9}{'episodes/s':>12}{'env steps/s':>13}{'x single':>10}")
    for name, wall, _ in rows:
        print(f"{name:<28}{wall:>9.2f}{args.episodes / wall:>12.2f}{steps / wall:>13.1f}{base_wall / wall:>10.2f}")
    print()
    sys.stdout.flush()
    subprocess.run([sys.executable, str(ROOT / "bench" / "serve.py"), "--episodes", str(args.serve_episodes)],
                   check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
