"""Scale-out: rollout throughput with Ray env workers, and generation through ``arborl serve``.

1. Env- and tool-bound: the code-agent recipe (examples/code_agent.toml: every turn of the
   expert runs the model-written program in the sandbox) rolled out by its expert, a scripted
   policy, so generation costs nothing and the table measures the env side alone. The same
   episodes run on the single-process engine (``rollout.env_workers`` = 8 threads) and on 1, 2 and 4
   Ray env worker actors of a Ray instance this script starts (``cluster.address = "local"``),
   each running 1 or 8 env calls at once (``cluster.env_worker_threads``).
   Prints episodes/s, env steps/s and each row's throughput as a ratio to the single-process one,
   and whether every row produced the same episodes.
2. FrozenLake generation on Ray generation actors (``cluster.generation = "actor"``): one RL
   iteration's rollout of the recipe (examples/frozenlake.toml: its model shape with random
   weights, ``rl.tasks_per_iter`` x ``rl.group_size`` sampled episodes plus the branches of every
   visited state) in this process (:func:`arborl.train.rl.roll_specs`) and on 1 and 2 actors of a
   Ray instance this script starts (:class:`arborl.cluster.rollouts.ActorRollouts`: the groups
   split over the actors, the weights pushed through the object store). Timed from the weight
   push to the last share back, after one warm-up iteration; each row also checks that its
   episodes are the single-process ones (1 actor) or the same on a second go (2 actors).
3. FrozenLake through ``arborl serve`` against in-process generation: ``bench/serve.py`` (run as
   it is, its table printed here).

What the ratios measure. The single-process engine already steps a turn's envs on threads, and a
sandboxed program runs in its own process, so threads overlap tool calls too; actors add
process-level parallelism for the Python side of the env (parsing, test harness, reward) and
let envs run on other machines. An actor with one thread steps its envs one at a time, so
1 worker x 1 thread is the serial baseline. On a machine with few cores the figures are bounded by those cores.

Usage: ``python bench/scale.py [--episodes 32] [--workers 1,2,4] [--worker-threads 1,8] [--actors 1,2]
[--actor-tasks 16] [--serve-episodes 32] [--only-actors]``
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
    cfg = load_config(TrainConfig, ROOT / "examples" / "code_agent.toml",  # the perfect teacher: every episode runs code
                      [f'run_dir="{tempfile.mkdtemp()}"', "env.kwargs.oracle_error=0.0"])
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


def _episode_view(eps) -> list:
    return [(e.group_id, [(t.output_ids, t.output_logprobs, t.reward) for t in e.turns]) for e in eps]


def actor_rows(tasks: int, actor_counts: list[int]) -> list[tuple[str, float, int, bool]]:
    """(label, wall seconds of one iteration's rollout, episodes, reproduced) in process, then on each actor count."""
    from arborl.cluster.rollouts import ActorRollouts
    from arborl.policy import load_policy
    from arborl.train.profile import PhaseTimer
    from arborl.train.rl import roll_specs, rollout_specs
    from arborl.train.stages import prepare_policy

    def config(n: int) -> TrainConfig:
        extra = [f'run_dir="{tempfile.mkdtemp()}"', f"rl.tasks_per_iter={tasks}", "threads=1"]
        if n:
            extra += ['cluster.address="local"', 'cluster.generation="actor"', f"cluster.generation_workers={n}",
                      "cluster.generation_worker_cpus=0.01"]
        return load_config(TrainConfig, ROOT / "examples" / "frozenlake.toml", extra)

    cfg = config(0)
    make_env = env_factory(cfg.env)
    start = prepare_policy(cfg, make_env)
    model, tok = load_policy(start)
    env = make_env()
    task_type, actions = task_type_of(env), list(env.actions)
    env.close()

    def in_process() -> tuple[float, list]:
        gen, task_gen = torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)
        roll_specs(cfg, 0, model, tok, gen, rollout_specs(cfg, 0, task_gen, task_type), make_env, actions, 0,
                   PhaseTimer())  # warm-up
        t0 = time.perf_counter()
        ro = roll_specs(cfg, 1, model, tok, gen, rollout_specs(cfg, 1, task_gen, task_type), make_env, actions, 1,
                        PhaseTimer())
        return time.perf_counter() - t0, ro.episodes

    def on_actors(acfg: TrainConfig) -> tuple[float, list]:
        gen, task_gen = torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)
        with ActorRollouts(acfg, model, start, actions, task_type, start=0, stop=2, gen=gen, task_gen=task_gen) as pool:
            pool.take(0)  # warm-up (each actor fetches the weights once)
            t0 = time.perf_counter()
            pool.publish(1, model)
            eps = pool.take(1).episodes
            return time.perf_counter() - t0, eps

    base_wall, base = in_process()
    rows = [("in process", base_wall, len(base), True)]
    with connect(ClusterConfig(address="local", object_store_mb=200)):
        for n in actor_counts:
            acfg = config(n)
            wall, eps = on_actors(acfg)
            again = base if n == 1 else on_actors(acfg)[1]  # 1 actor: the in-process episodes; more: itself
            rows.append((f"ray, {n} generation actor{'s' * (n > 1)}", wall, len(eps),
                         _episode_view(eps) == _episode_view(again)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--worker-threads", default="1,8", help="cluster.env_worker_threads values to run")
    ap.add_argument("--actors", default="1,2", help="generation actor counts to run")
    ap.add_argument("--actor-tasks", type=int, default=16, help="rl.tasks_per_iter of the generation rows")
    ap.add_argument("--serve-episodes", type=int, default=32)
    ap.add_argument("--only-actors", action="store_true", help="print the generation actor table only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen_rows = actor_rows(args.actor_tasks, [int(n) for n in args.actors.split(",")])
    print(f"FrozenLake recipe, one RL iteration's rollout ({args.actor_tasks} tasks x 4, plus branches); "
          "reproduced: 1 actor = the in-process episodes, 2 actors = the same episodes on a second go")
    print(f"{'generation':<28}{'wall s':>9}{'episodes':>10}{'episodes/s':>12}{'x in process':>14}{'reproduced':>12}")
    for name, wall, n, same in gen_rows:
        print(f"{name:<28}{wall:>9.2f}{n:>10}{n / wall:>12.2f}{gen_rows[0][1] / wall:>14.2f}{str(same):>12}")
    print()
    sys.stdout.flush()
    if args.only_actors:
        return
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
