"""The ``arborl`` command line: the one place where names in a config map to objects.

    arborl train CONFIG.toml [--set key=value ...] [--resume]   # synth -> sft -> rl -> eval
    arborl synth|sft|rl|eval CONFIG.toml [--set ...]              # one stage
    arborl store query|slice|profile|export|expire STORE_URL ...  # inspect a trajectory store
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

from torch import Tensor

from arborl import credit
from arborl.config import ConfigError, load_config
from arborl.train.config import RLConfig

# Names that configs may use, and the objects they stand for: this table is the only registry.
CREDIT_ESTIMATORS: dict[str, Callable[[RLConfig], Callable[..., Tensor]]] = {
    "grpo": lambda rl: functools.partial(credit.grpo, norm_by_std=rl.norm_by_std, length_neutral=rl.length_neutral),
    "gigpo": lambda rl: functools.partial(
        credit.gigpo, gamma=rl.gamma, step_weight=rl.step_weight, norm_by_std=rl.norm_by_std,
        length_neutral=rl.length_neutral,
    ),
    "best_step": lambda rl: functools.partial(credit.best_step, gamma=rl.gamma),
}


def credit_from_config(rl: RLConfig) -> Callable[..., Tensor]:
    """Bind the configured credit estimator to its options."""
    if rl.credit not in CREDIT_ESTIMATORS:
        raise ConfigError(f"rl.credit = {rl.credit!r} is unknown; choose one of {sorted(CREDIT_ESTIMATORS)}")
    return CREDIT_ESTIMATORS[rl.credit](rl)


def _summary_table(summary: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"arborl run: {summary['run_dir']}")
    table.add_column("metric")
    table.add_column("after SFT", justify="right")
    table.add_column("after RL", justify="right")
    for key, label in (("success", "success rate (greedy, held-out)"), ("reward", "mean reward"),
                       ("turns", "mean turns"), ("invalid_frac", "invalid actions")):
        cells = [f"{summary[s][key]:.3f}" if s in summary else "-" for s in ("sft", "rl")]
        table.add_row(label, *cells)
    table.add_row("env steps", "", f"{summary.get('env_steps', 0):,}")
    table.add_row("tokens trained (RL)", "", f"{summary.get('tokens', 0):,}")
    table.add_row("wall time", "", f"{summary['wall_s']:.0f} s")
    table.add_row("peak RSS", "", f"{summary['peak_rss_mb']:.0f} MB")
    console.print(table)
    console.print(f"summary: {summary['run_dir']}/summary.json   curve: {summary['run_dir']}/learning_curve.png")


def _run(args: argparse.Namespace, stages: list[str] | None) -> int:
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from arborl.train.config import TrainConfig
    from arborl.train.pipeline import run_pipeline

    hf_logging.disable_progress_bar()  # our own bars show the stages; per-load bars are noise
    console = Console(stderr=False)
    overrides = list(args.set or [])
    if stages is not None:
        overrides.append(f"stages={stages!r}".replace("'", '"'))
    cfg = load_config(TrainConfig, args.config, overrides)
    summary = run_pipeline(cfg, credit_from_config(cfg.rl), resume=args.resume, console=console)
    _summary_table(summary, console)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arborl", description="RL for multi-turn, tool-calling LLM agents.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("train", "run the configured pipeline (synth -> sft -> rl -> eval)"),
                        ("synth", "synthesize expert trajectories into the store"),
                        ("sft", "SFT cold start on stored trajectories"),
                        ("rl", "online RL from the SFT checkpoint (or the initial policy)"),
                        ("eval", "greedy evaluation of the SFT and RL checkpoints on held-out tasks")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("config", help="TOML config file, e.g. examples/frozenlake.toml")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable), e.g. rl.lr=3e-4")
        sp.add_argument("--resume", action="store_true", help="continue RL from the latest checkpoint in run_dir")
        sp.set_defaults(stages=None if name == "train" else [name])
    try:
        from arborl.store.cli import add_store_commands
    except ImportError:  # the store CLI module is part of the package; keep `train` usable regardless
        add_store_commands = None
    if add_store_commands is not None:
        add_store_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "config"):
            return _run(args, args.stages)
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError) as e:
        print(f"arborl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
