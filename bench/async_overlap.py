"""Does a rollout overlap an update better on a thread or in a second process? (rl.max_staleness's worker)

Loads a FrozenLake policy (``--policy``, e.g. a demo run's ``policy/sft``) and times, with one
torch thread per side as the demo runs:

* ``R``: one rollout of ``--rollout-episodes`` FrozenLake episodes (the kept-cache engine);
* ``U``: ``--epochs`` PPO-clip passes over a batch of ``--episodes`` episodes (forward, backward, AdamW);
* ``thread``: R on a second thread while U runs on the main one (what ``RolloutWorker`` does);
* ``process``: R in a second process while U runs in this one (the upper bound a worker process
  could reach: no weights or episodes cross the boundary here).

Perfect overlap on two free cores takes ``max(R, U)``; no overlap takes ``R + U``. On a machine
other processes load, every figure includes their share of the cores: run it alone for clean
numbers, and compare thread with process in the same run.

Usage: ``python bench/async_overlap.py --policy runs/frozenlake/policy/sft [--episodes 64] [--rollout-episodes 512]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time

import torch

from arborl.config import load_config
from arborl.loss import ppo_clip_loss
from arborl.policy import load_policy, token_logprobs_and_entropy
from arborl.rollout import run_episodes
from arborl.rollout.http_policy import rollout_policy
from arborl.train.batch import collate
from arborl.train.common import env_factory
from arborl.train.config import TrainConfig
from arborl.train.stages import specs_for

CONFIG = "examples/frozenlake.toml"


def rollout(policy_dir: str, episodes: int, ready=None, go=None) -> float:
    """Seconds of one rollout of ``episodes`` FrozenLake episodes (loads its own copy of the policy first).

    With ``ready`` / ``go`` (events), it sets ``ready`` once loaded and starts when ``go`` is set.
    """
    torch.set_num_threads(1)
    cfg = load_config(TrainConfig, CONFIG)
    model, tok = load_policy(policy_dir)
    specs = specs_for(cfg, "frozenlake", list(range(episodes // 4)), group_size=4)
    if ready is not None:
        ready.set()
        go.wait()
    t0 = time.perf_counter()
    run_episodes(rollout_policy(cfg.policy, model, tok, 0, "/tmp"), env_factory(cfg.env), specs, cfg.rollout,
                 generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - t0


def _rollout_in_child(policy_dir: str, episodes: int, out, ready, go) -> None:
    out.put(rollout(policy_dir, episodes, ready, go))


def overlapped(update, start_rollout, ready, go, wait) -> float:
    """Wall seconds of ``update()`` beside a rollout that was started, loaded, and is let go with the update."""
    start_rollout()
    ready.wait()
    t0 = time.perf_counter()
    go.set()
    update()
    wait()
    return time.perf_counter() - t0


def update_fn(policy_dir: str, episodes: int, epochs: int):
    """A function that runs ``epochs`` PPO-clip passes over a fixed batch and returns its seconds."""
    cfg = load_config(TrainConfig, CONFIG)
    model, tok = load_policy(policy_dir)
    eps = run_episodes(rollout_policy(cfg.policy, model, tok, 0, "/tmp"), env_factory(cfg.env),
                       specs_for(cfg, "frozenlake", list(range(episodes // 4)), group_size=4), cfg.rollout,
                       generator=torch.Generator().manual_seed(9))
    batch = collate(eps, pad_id=tok.pad_token_id or 0)
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1)) * batch.loss_mask
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def update() -> float:
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        for _ in range(epochs):
            for rows in torch.arange(len(eps)).split(cfg.rl.minibatch_size):
                sub = batch.select(rows)
                logp, _ = token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask,
                                                     positions=sub.loss_mask, entropy_grad=False)
                out = ppo_clip_loss(logp, sub.old_logp, adv[rows, : sub.input_ids.shape[1]], sub.loss_mask)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                opt.step()
        return time.perf_counter() - t0

    return update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--episodes", type=int, default=64, help="episodes of the update's batch")
    ap.add_argument("--rollout-episodes", type=int, default=512,
                    help="episodes of the rollout (the demo's group + branch rollouts are ~500 episodes)")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    update = update_fn(args.policy, args.episodes, args.epochs)
    r, u = rollout(args.policy, args.rollout_episodes), update()
    ready, go = threading.Event(), threading.Event()
    worker = threading.Thread(target=rollout, args=(args.policy, args.rollout_episodes, ready, go))
    thread = overlapped(update, worker.start, ready, go, worker.join)
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    child = ctx.Process(target=_rollout_in_child, args=(args.policy, args.rollout_episodes, q, ready, go))
    process = overlapped(update, child.start, ready, go, lambda: (q.get(), child.join()))
    print(f"R {r:.2f} s  U {u:.2f} s  R+U {r + u:.2f} s  max {max(r, u):.2f} s")
    print(f"thread  {thread:.2f} s ({(r + u) / thread:.2f}x of sequential)")
    print(f"process {process:.2f} s ({(r + u) / process:.2f}x of sequential)")


if __name__ == "__main__":
    main()
