"""The configured pipeline, ``synth -> sft -> rl -> eval``, and its outputs: summary table, summary.json, plot.

``summary.json`` keys (documented in the README):

* ``sft`` / ``rl``: ``{"success", "reward", "turns", "invalid_frac"}`` of greedy evaluation on
  ``eval.episodes`` held-out tasks, for the SFT checkpoint and the final RL checkpoint (absent when
  the stage did not run).
* ``rl_gain``: ``rl.success - sft.success`` (absent unless both ran).
* ``env_steps``: environment steps of experience (demonstration turns + RL rollout turns).
* ``tokens``: model-generated tokens trained on in RL.
* ``wall_s``: seconds the whole command took; ``stage_s``: seconds per stage.
* ``peak_rss_mb``: peak resident memory of the process.
* ``run_dir``, ``store``, ``config``: where things are, and the resolved config.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
import torch

from arborl.config import to_dict
from arborl.policy import load_policy
from arborl.store import open_store
from arborl.train.common import Metrics, env_factory, seed_everything
from arborl.train.config import TrainConfig
from arborl.train.plot import plot_learning_curve
from arborl.train.rl import CreditFn, latest_checkpoint, train_rl
from arborl.train.sft import train_sft
from arborl.train.stages import evaluate, policy_dir, prepare_policy, synthesize


def _save_config(cfg: TrainConfig, run_dir: Path) -> None:
    data = json.loads(json.dumps(to_dict(cfg)))  # tuples -> lists for TOML
    (run_dir / "config.toml").write_text(tomli_w.dumps(data))


def run_pipeline(cfg: TrainConfig, credit: CreditFn, *, resume: bool = False, console=None) -> dict[str, Any]:
    """Run the configured stages in order and write summary.json + learning_curve.png."""
    t0 = time.time()
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _save_config(cfg, run_dir)
    make_env = env_factory(cfg.env)
    metrics = Metrics(run_dir)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "store": cfg.store_url, "stage_s": {}}
    stages = cfg.stages
    with open_store(cfg.store_url) as store:
        init = prepare_policy(cfg, make_env)
        demo_turns = 0
        if "synth" in stages:
            ts = time.time()
            synthesize(cfg, make_env, init, store)
            summary["stage_s"]["synth"] = time.time() - ts
        if "sft" in stages:
            ts = time.time()
            _, stats = train_sft(cfg, make_env, init, store, metrics)
            demo_turns = stats["demo_turns"]
            summary.update(stats)
            summary["stage_s"]["sft"] = time.time() - ts
        sft_path = policy_dir(cfg, "sft")
        if "rl" in stages:
            ts = time.time()
            start = sft_path if (sft_path / "config.json").exists() else init
            train_rl(cfg, make_env, start, store, metrics, credit,
                     resume=resume and latest_checkpoint(cfg.run_dir) is not None, env_steps_before=demo_turns)
            summary["stage_s"]["rl"] = time.time() - ts
        if "eval" in stages:
            ts = time.time()
            _final_eval(cfg, make_env, store, summary, _progress_fn(console))
            summary["stage_s"]["eval"] = time.time() - ts
    rl_rows = [r for r in metrics.rows() if r["stage"] == "rl"]
    summary["env_steps"] = rl_rows[-1]["env_steps"] if rl_rows else demo_turns
    summary["tokens"] = rl_rows[-1]["tokens"] if rl_rows else 0
    if "sft" in summary and "rl" in summary:
        summary["rl_gain"] = summary["rl"]["success"] - summary["sft"]["success"]
    summary["wall_s"] = time.time() - t0
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary["config"] = to_dict(cfg)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    plot_learning_curve(metrics.rows(), run_dir / "learning_curve.png", final=summary)
    metrics.close()
    return summary


def _progress_fn(console) -> Callable[[str], None]:
    return (lambda msg: console.print(msg)) if console is not None else (lambda msg: None)


def _final_eval(cfg: TrainConfig, make_env, store, summary: dict[str, Any], say: Callable[[str], None]) -> None:
    for name in ("sft", "rl"):
        path = policy_dir(cfg, name)
        if not (path / "config.json").exists():
            continue
        say(f"evaluating {name} checkpoint on {cfg.eval.episodes} held-out tasks (greedy)")
        model, tok = load_policy(path)
        model.eval()
        summary[name] = evaluate(cfg, make_env, model, tok, n=cfg.eval.episodes, store=store, label=f"eval-{name}")
