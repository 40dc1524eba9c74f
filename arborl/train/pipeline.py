"""The configured pipeline, ``synth -> midtrain -> sft -> rl -> merge -> eval``, and its outputs: summary table, summary.json, plot.

``summary.json`` keys (documented in the README):

* ``midtrain`` / ``sft`` / ``rl`` / ``merge``: ``{"success", "reward", "turns", "invalid_frac"}`` of greedy evaluation on
  ``eval.episodes`` held-out tasks, for the SFT checkpoint and the final RL checkpoint (absent when
  the stage did not run). ``midtrain_tokens`` / ``midtrain_documents``: what mid-training trained on.
* ``init`` / ``checkpoint`` (with ``init_path`` / ``checkpoint_path``): the same, for the initial policy
  (``arborl eval`` in a run without SFT or RL checkpoints) or the ``--checkpoint`` evaluated.
* ``rl_gain``: ``rl.success - sft.success`` (absent unless both ran).
* ``env_steps``: environment steps of experience (demonstration turns + RL rollout turns).
* ``tokens``: model-generated tokens trained on in RL.
* ``demo_episodes``, ``demo_turns``: the demonstrations SFT trained on.
* ``wall_s``: seconds the whole command took; ``stage_s``: seconds per stage.
* ``peak_rss_mb``: peak resident memory of the process.
* ``rl_profile``: mean seconds and share of an RL iteration per phase (:mod:`arborl.train.profile`).
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

from arborl.cluster import cluster_envs, with_generation_workers
from arborl.config import ConfigError, to_dict
from arborl.env import Env, check_env
from arborl.merge.checkpoint import merge_checkpoints
from arborl.policy import load_policy
from arborl.store import open_store
from arborl.store.url import redact
from arborl.train.common import env_factory, seed_everything
from arborl.train.config import TrainConfig
from arborl.train.interrupt import Interrupted
from arborl.train.loggers import Metrics, check_loggers
from arborl.train.midtrain import train_midtrain
from arborl.train.plot import plot_learning_curve
from arborl.train.profile import profile_summary
from arborl.train.rl import CreditFn, train_rl
from arborl.train.rundir import Plan, RunDir, checkpoint_iteration
from arborl.train.sft import train_sft
from arborl.train.stages import evaluate, policy_dir, prepare_policy, synthesize


def _save_config(cfg: TrainConfig, run_dir: Path) -> None:
    data = json.loads(json.dumps(to_dict(cfg)))  # tuples -> lists for TOML
    (run_dir / "config.toml").write_text(tomli_w.dumps(data))


def run_pipeline(cfg: TrainConfig, credit: CreditFn, *, resume: bool = False, overwrite: bool = False,
                 checkpoint: str | None = None, console=None,
                 credit_model: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Run the configured stages in order and write summary.json + learning_curve.png.

    Args:
        cfg: The run's config.
        credit: The credit estimator RL uses (see ``arborl.cli.credit_from_config``).
        resume: Continue the run in ``cfg.run_dir``: skip the stages that finished, continue RL from
            its newest checkpoint.
        overwrite: Replace the outputs of the configured stages that an earlier run left in ``run_dir``.
        checkpoint: Evaluate this checkpoint directory (instead of the run's own) in the eval stage.
        console: A rich console for messages (None: quiet).
        credit_model: The builder ``(cfg, policy, tok) -> CreditModel`` of the model ``credit`` needs
            (``arborl.cli.CREDIT_MODELS``), or None; RL builds it from its start policy.

    Raises:
        ConfigError: ``run_dir`` already holds outputs of these stages and neither ``resume`` nor
            ``overwrite`` is set, or ``resume`` finds nothing to resume.
        Interrupted: Ctrl-C; the message says where the run stopped and how to continue.
    """
    t0 = time.time()
    say = _progress_fn(console)
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    run_dir = Path(cfg.run_dir)
    # everything that can be checked is checked before the run directory is touched
    check_loggers(cfg.report_to)
    make_env = env_factory(cfg.env)
    _check(make_env)
    rd = RunDir(run_dir, default_store=not cfg.store)
    with rd.hold():
        plan = rd.plan(cfg.stages, rl_iterations=cfg.rl.iterations, resume=resume, overwrite=overwrite)
        if plan.run == ["eval"]:
            _eval_targets(cfg, checkpoint)
        _say_plan(plan, resume, say)
        if overwrite and cfg.store and "synth" in plan.run:
            say(f"--overwrite: the store {cfg.store} is not in run_dir; the episodes an earlier run stored there stay")
        summary: dict[str, Any] = {"run_dir": str(run_dir), "store": redact(cfg.store_url), "stage_s": {}}
        summary.update(plan.state.get("sft", {}))
        with open_store(cfg.store_url) as store, cluster_envs(cfg.cluster, cfg.env, make_env, say) as make_env:
            _save_config(cfg, run_dir)
            metrics = Metrics(run_dir, cfg.report_to, config=to_dict(cfg))
            try:
                _run_stages(cfg, plan, rd, make_env, store, metrics, (credit, credit_model), summary, checkpoint, say)
            except BaseException:
                metrics.close()
                raise
            rl_rows = [r for r in metrics.rows() if r["stage"] == "rl"]
            summary["env_steps"] = rl_rows[-1]["env_steps"] if rl_rows else summary.get("demo_turns", 0)
            summary["tokens"] = rl_rows[-1]["tokens"] if rl_rows else 0
            if profile := profile_summary(rl_rows):
                summary["rl_profile"] = profile
            if "sft" in summary and "rl" in summary:
                summary["rl_gain"] = summary["rl"]["success"] - summary["sft"]["success"]
            summary["wall_s"] = time.time() - t0
            summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            summary["config"] = to_dict(cfg)
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        plot_learning_curve(metrics.rows(), run_dir / "learning_curve.png", final=summary)
        metrics.close()
        return summary


def _check(make_env: Callable[[], Env]) -> None:
    """Build one env and run ``check_env`` on it."""
    env = make_env()
    try:
        check_env(env)
    finally:
        close = getattr(env, "close", None)
        if callable(close):  # an env without close() gets check_env's message, not an AttributeError
            close()


def _say_plan(plan: Plan, resume: bool, say: Callable[[str], None]) -> None:
    for stage, why in plan.skipped.items():
        say(f"resume: {stage} {why}; skipped")
    if plan.resume_from is not None:
        say(f"resume: rl continues from checkpoint {plan.resume_from} (iteration {checkpoint_iteration(plan.resume_from)})")
    elif resume and "rl" in plan.run:
        say("resume: rl has no checkpoint yet; rl starts at iteration 0")


def _run_stages(cfg: TrainConfig, plan: Plan, rd: RunDir, make_env, store, metrics: Metrics,
                credit: tuple[CreditFn, Callable[..., Any] | None], summary: dict[str, Any], checkpoint: str | None,
                say: Callable[[str], None]) -> None:
    """Run ``plan.run`` in order, recording each finished stage in the run directory.

    ``credit`` is the estimator and the builder of its credit model (or None).
    """
    init = prepare_policy(cfg, make_env) if set(plan.run) - {"eval"} else None
    cfg, _servers = with_generation_workers(cfg, str(init), say) if "rl" in plan.run and init else (cfg, [])
    for stage in plan.run:
        ts = time.time()
        try:
            if stage == "synth":
                episodes = synthesize(cfg, make_env, init, store)
                rd.mark_finished("synth", {"synth_episodes": len(episodes)})
            elif stage == "midtrain":
                _, stats = train_midtrain(cfg, make_env, init, store, metrics)
                summary.update(stats)
                rd.mark_finished("midtrain", stats)
            elif stage == "sft":
                _, stats = train_sft(cfg, make_env, latest_policy(cfg, ("midtrain",), init), store, metrics)
                summary.update(stats)
                rd.mark_finished("sft", stats)
            elif stage == "merge":
                merge_checkpoints(cfg.merge, policy_dir(cfg, "merge"), run_dir=cfg.run_dir)
                rd.mark_finished("merge")
            elif stage == "rl":
                start = latest_policy(cfg, ("sft", "midtrain"), init)
                estimator, build_model = credit
                model = build_model(cfg, *load_policy(start)) if build_model is not None else None
                train_rl(cfg, make_env, start, store, metrics, estimator, resume_from=plan.resume_from,
                         env_steps_before=summary.get("demo_turns", 0), credit_model=model)
            else:
                _final_eval(cfg, make_env, store, summary, say, checkpoint)
        except KeyboardInterrupt:  # Ctrl-C outside RL's iteration boundaries: this stage is redone on --resume
            raise Interrupted(stage) from None
        summary["stage_s"][stage] = time.time() - ts


def latest_policy(cfg: TrainConfig, names: tuple[str, ...], default: Path) -> Path:
    """The first of the run's ``names`` policies that exists (e.g. ``sft`` then ``midtrain``), else ``default``."""
    for name in names:
        if (policy_dir(cfg, name) / "config.json").exists():
            return policy_dir(cfg, name)
    return default


def _progress_fn(console) -> Callable[[str], None]:
    return (lambda msg: console.print(msg, soft_wrap=True, highlight=False)) if console is not None else (lambda msg: None)


EVAL_LABELS = {"checkpoint": "checkpoint", "init": "initial policy", "midtrain": "after mid-training",
               "sft": "after SFT", "rl": "after RL", "merge": "merged"}
"""Keys of summary.json that hold an evaluation, and their column titles."""


def _eval_targets(cfg: TrainConfig, checkpoint: str | None) -> list[tuple[str, Path]]:
    """What the eval stage evaluates: ``checkpoint``; else the run's SFT and RL policies; else the initial one."""
    if checkpoint is not None:
        return [("checkpoint", Path(checkpoint))]
    found = [(name, policy_dir(cfg, name)) for name in ("midtrain", "sft", "rl", "merge")
             if (policy_dir(cfg, name) / "config.json").exists()]
    if found:
        return found
    if cfg.policy.init != "scratch":
        return [("init", Path(cfg.policy.init))]
    if (policy_dir(cfg, "init") / "config.json").exists():
        return [("init", policy_dir(cfg, "init"))]
    raise ConfigError(
        f"nothing to evaluate: run_dir {cfg.run_dir!r} has no policy/sft or policy/rl checkpoint; "
        "pass --checkpoint PATH or --set policy.init=PATH, or train first"
    )


def _final_eval(cfg: TrainConfig, make_env, store, summary: dict[str, Any], say: Callable[[str], None],
                checkpoint: str | None) -> None:
    for name, path in _eval_targets(cfg, checkpoint):
        say(f"evaluating {path} on {cfg.eval.episodes} held-out tasks ({'greedy' if cfg.eval.greedy else 'sampled'})")
        model, tok = load_policy(path)
        model.eval()
        summary[name] = evaluate(cfg, make_env, model, tok, n=cfg.eval.episodes, store=store, label=f"eval-{name}")
        if name in ("checkpoint", "init"):
            summary[f"{name}_path"] = str(path)
