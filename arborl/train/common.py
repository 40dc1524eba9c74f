"""Pieces every stage shares: env construction, the run directory, metrics, checkpoints, RNG state."""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arborl.config import ConfigError
from arborl.env import Env, EnvCheckError
from arborl.train.config import EnvSpec

METRICS = {
    # every row
    "stage": "which stage wrote the row (sft, rl)",
    "step": "optimizer step (sft) or iteration (rl) within the stage, from 1",
    "time": "unix time the row was written",
    "env_steps": "environment steps of experience consumed so far in the run (demonstrations + rollouts); a "
                 "continuation's re-played prefix (branches, tree rollouts) is its trunk's turns and not counted again",
    # probe evaluations (rows of every sft.eval_every steps / rl.eval_every iterations)
    "success": "fraction of evaluated episodes with rewards['success'] > 0 (greedy, held-out tasks)",
    "reward": "mean episode return (sum of env rewards) on the same evaluation",
    "turns": "mean turns per episode on the same evaluation",
    "invalid_frac": "fraction of turns whose action was invalid on the same evaluation",
    # optimisation (sft and rl)
    "lr": "learning rate of the row's step / iteration",
    "grad_norm": "global gradient norm before clipping (rl: mean over the iteration's optimizer steps)",
    "loss/sft": "SFT: masked mean negative log-likelihood of the demonstrated tokens",
    "loss/policy": "RL: PPO clipped surrogate, aggregated with rl.loss_agg (mean over the iteration's steps)",
    "loss/kl": "RL: KL to the start-of-RL policy (estimator rl.kl_kind); only when rl.kl_coef > 0",
    "loss/entropy": "RL: mean token entropy of the policy on trained tokens",
    "diag/clip_frac": "RL: fraction of trained tokens where the clipped branch of PPO was active",
    "diag/approx_kl": "RL: mean 0.5 * (logp - old_logp)^2, a k2 estimate of KL(behaviour || current)",
    "diag/ratio_max": "RL: largest importance ratio in the minibatch (mean over the iteration's steps)",
    "diag/behav_weight_mean": "RL, recomputed log-probs (stale batch, rl.recompute_logp): mean behaviour weight "
                              "pi_prox / pi_behav",
    "diag/behav_weight_max": "RL, recomputed log-probs: largest behaviour weight pi_prox / pi_behav, before truncation",
    "diag/behav_trunc_frac": "RL, recomputed log-probs: fraction of trained tokens whose behaviour weight hit "
                             "rl.behav_cap",
    "diag/behav_logp_gap": "RL, recomputed log-probs: mean |log pi_prox - log pi_behav| over trained tokens (the "
                           "sampler's distance from the trainer)",
    "train/staleness": "RL: policy versions between the weights that sampled the batch and those it updates",
    "train/staleness_max": "RL: largest policy-version lag of any turn of the batch (<= rl.max_staleness)",
    "time/rollout_worker": "RL, rl.max_staleness >= 1: seconds the rollout worker spent sampling the batch",
    # RL rollouts of the iteration (sampling, training tasks)
    "train/success": "success rate of the group rollouts of this RL iteration (sampling, training tasks; no branches)",
    "train/reward": "mean return of the same group rollouts",
    "train/branches": "continuations rolled out this iteration (rl.branch: untried actions at visited states; "
                      "rl.tree: re-sampled turns)",
    "train/prefix_reused": "shared prefix tokens of this iteration's continuations taken from the trunks' kept KV "
                           "caches (prefill saved)",
    "train/prefix_prefilled": "shared prefix tokens of this iteration's continuations that were prefilled again",
    "train/invalid_frac": "fraction of this iteration's turns (branches included) whose action was invalid",
    "train/turns": "mean turns per group-rollout episode",
    "train/adv_abs": "mean |advantage| over trained tokens",
    "train/kept_frac": "fraction of rollouts the update uses: a non-zero advantage somewhere, in a group rl.filter kept",
    "train/filter_kept_frac": "fraction of this iteration's groups that rl.filter kept (1 without a filter)",
    "train/filter_empty": "iterations so far in which rl.filter kept no group (nothing was trained on them)",
    "train/env_errors": "episodes of this iteration (branches included) that ended on an env or tool error "
                        "(stop_reason env_error; rl.error_policy drops them or scores them 0)",
    "train/max_context": "episodes of this iteration (branches included) cut at rollout.max_context_tokens "
                         "(stop_reason max_context; handled by rl.error_policy like env errors)",
    "tools/calls_per_episode": "tool calls per group-rollout episode of this iteration (0 for envs without tools); "
                               "tool envs also log tools/<name>/{calls,errors,timeouts} (arborl.tools.metrics)",
    "tools/time_share": "share of this iteration's rollout time spent in tool calls: sum of tool latencies over "
                        "sum of (generate + env) seconds of every turn (0 without tools)",
    "tokens": "model-generated tokens trained on in RL so far (of the episodes the updates used)",
    "replayed_steps": "RL: environment steps re-played so far to reach the start state of continuations (a trunk's "
                      "turns again, for branches and tree rollouts); not part of env_steps",
    # per-phase wall-clock profile of each RL iteration (seconds; arborl.train.profile)
    "time/rollout": "RL: seconds of the iteration's group rollouts",
    "time/branch": "RL: seconds of the iteration's branch rollouts (rl.branch)",
    "time/store": "RL: seconds the iteration waited on the trajectory store (writing its episodes)",
    "time/credit": "RL: seconds of step batching, rl.filter, the credit estimator and collation",
    "time/ref_logp": "RL: seconds of the reference policy's log-probs (rl.kl_coef > 0) and, when recomputed (a stale "
                     "batch, rl.recompute_logp), the proximal policy's",
    "time/update": "RL: seconds of the PPO epochs (forward, backward, optimizer steps)",
    "time/eval": "RL: seconds of the iteration's probe evaluation (every rl.eval_every iterations)",
    "time/iteration": "RL: wall seconds of the whole iteration (the phases plus untimed glue)",
}
"""Every metric name written to metrics.jsonl (and to the ``report_to`` loggers), with its meaning.

``tests/train/test_metrics_documented.py`` fails when a run logs a key that is not here.
"""


def import_object(path: str, *, key: str) -> Any:
    """Import ``package.module:Name``; errors name the config ``key`` and the fix."""
    if ":" not in path:
        raise ConfigError(f"{key} = {path!r} must look like 'package.module:ClassName'")
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"{key} = {path!r}: cannot import module {mod_name!r} ({e}); is it installed and on PYTHONPATH?") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"{key} = {path!r}: module {mod_name!r} has no attribute {attr!r}") from None


def env_factory(spec: EnvSpec) -> Callable[[], Env]:
    """A zero-argument constructor of the configured environment."""
    cls = import_object(spec.cls, key="env.cls")
    kwargs = dict(spec.kwargs)

    if not callable(cls):
        raise ConfigError(f"env.cls = {spec.cls!r} is a {type(cls).__name__}, not a class; name an env class")

    def make() -> Env:
        try:
            env = cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"env.kwargs {kwargs} do not fit {spec.cls}: {e}") from e
        missing = [m for m in ("reset", "step", "format_observation") if not callable(getattr(env, m, None))]
        if missing:
            raise EnvCheckError(
                f"env.cls = {spec.cls!r} is not an env: {type(env).__name__} has no "
                f"{', '.join(missing)}. An env needs reset(seed=...), step(action) and format_observation(obs) "
                "(see arborl/env/base.py)"
            )
        return env

    return make


def task_type_of(env: Env) -> str:
    """The env's ``task_type`` attribute, or its class name in lower case."""
    return str(getattr(env, "task_type", type(env).__name__.lower()))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global random streams."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG stream a stage uses, for exact resume."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Restore what :func:`rng_state` saved."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])


def save_trainer_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` with ``torch.save``, atomically (a crash leaves no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_trainer_state(path: Path) -> dict[str, Any]:
    """Read what :func:`save_trainer_state` wrote."""
    if not path.exists():
        raise FileNotFoundError(f"no trainer state at {path}; the checkpoint is incomplete, start without --resume")
    return torch.load(path, weights_only=False)
