"""The ``arborl`` command line: the one place where names in a config map to objects.

    arborl train CONFIG.toml [--set key=value ...] [--resume | --overwrite]   # synth -> sft -> rl -> eval
    arborl synth|midtrain|sft|rl CONFIG.toml [--set ...] [--resume | --overwrite]      # one stage
    arborl eval CONFIG.toml [--set ...] [--checkpoint PATH]                   # evaluate, print the table
    arborl config show CONFIG.toml [--set ...]     # the resolved config, each key with default and help
    arborl config keys                             # every config key
    arborl compare CONFIG.toml --methods grpo,gigpo,... --seeds 3  # methods side by side, equal env steps
    arborl store query|slice|profile|export|expire|show STORE_URL ...  # inspect a trajectory store
    arborl view STORE_URL [--run RUN_DIR ...]     # explore episodes, groups and runs in the browser
    arborl serve CHECKPOINT [--port N]             # OpenAI-compatible server over a checkpoint
    arborl merge --method ties --out DIR CKPT1 CKPT2 [--base CKPT] [--weights ..] [--density ..]  # merge models

Heavy modules (torch, transformers) are imported by the commands that need them, so ``--help``
and ``--version`` answer at once. arborl's own errors (bad config, env, store, record, template,
sandbox) end the command with one line on stderr and exit code 2; Ctrl-C with a line that says
where the run stopped and exit code 130.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from arborl import __version__
from arborl.train.interrupt import Interrupted

if TYPE_CHECKING:
    from arborl.train.config import RLConfig

def _process_options(rl: RLConfig, *, gamma: float, auto_baseline: str) -> dict[str, Any]:
    """Options of ``arborl.credit.process``: the explicit and implicit PRMs differ only in the return's
    discount and in what ``prm_baseline = auto`` means.
    """
    return {"weight": rl.prm_weight, "gamma": gamma, "norm_by_std": rl.norm_by_std,
            "length_neutral": rl.length_neutral, "singleton": rl.singleton,
            "baseline": auto_baseline if rl.prm_baseline == "auto" else rl.prm_baseline,
            "step_norm_by_std": rl.prm_step_norm == "std", "anchor_weight": rl.anchor_weight, "anchor_gamma": rl.gamma}


# Names that configs may use, and the objects they stand for: this table is the only registry.
# Each name maps to a function of arborl.credit and the options it takes from the RL config.
CREDIT_ESTIMATORS: dict[str, tuple[str, Callable[[RLConfig], dict[str, Any]]]] = {
    "grpo": ("grpo", lambda rl: {"norm_by_std": rl.norm_by_std, "length_neutral": rl.length_neutral,
                                 "singleton": rl.singleton}),
    "rloo": ("rloo", lambda rl: {"length_neutral": rl.length_neutral, "singleton": rl.singleton}),
    "dr_grpo": ("dr_grpo", lambda rl: {"singleton": rl.singleton}),
    "gigpo": ("gigpo", lambda rl: {"gamma": rl.gamma, "step_weight": rl.step_weight, "norm_by_std": rl.norm_by_std,
                                   "length_neutral": rl.length_neutral, "singleton": rl.singleton}),
    "best_step": ("best_step", lambda rl: {"gamma": rl.gamma}),
    "turn_ppo": ("turn_gae", lambda rl: {"gamma": rl.gamma, "lam": rl.gae_lambda, "whiten": rl.whiten_advantages}),
    "archer": ("archer", lambda rl: {}),
    "prm": ("process", lambda rl: _process_options(rl, gamma=0.0, auto_baseline="group")),
    **{name: ("process", lambda rl: _process_options(rl, gamma=rl.prm_return_gamma, auto_baseline="rloo"))
       for name in ("implicit_prm", "istar")},
    "tree": ("tree", lambda rl: {"episode_weight": rl.tree_episode_weight, "norm_by_std": rl.norm_by_std,
                                 "length_neutral": rl.length_neutral, "singleton": rl.singleton}),
}


def _lazy_model(path: str, **options: Any) -> Callable[..., Any]:
    """A credit-model factory that imports ``module:Class`` when called (so ``--help`` stays fast)."""
    def build(cfg, policy, tok):
        import importlib

        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)(cfg, policy, tok, **options)
    return build


# rl.credit names whose estimator needs a trained model, and its factory ``(cfg, policy, tok) ->
# CreditModel`` (arborl.train.credit_models), called with the start policy of RL.
CREDIT_MODELS: dict[str, Callable[..., Any]] = {
    "turn_ppo": _lazy_model("arborl.critics.turn_ppo:build_turn_critic"),
    "archer": _lazy_model("arborl.critics.archer:build_archer_critic"),
    "prm": _lazy_model("arborl.prm.explicit:ExplicitPRM"),
    "implicit_prm": _lazy_model("arborl.prm.implicit:ImplicitPRM", objective="ce", reference="frozen"),
    "istar": _lazy_model("arborl.prm.implicit:ImplicitPRM", objective="dpo", reference="behaviour"),
}

# Methods of `arborl compare`: a name -> the config settings it stands for (an rl.credit estimator
# plus what it needs). A name not listed here means {"rl.credit": name}; `sft_more` is SFT alone.
COMPARE_METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"rl.credit": "grpo", "rl.branch": False},
    "rloo": {"rl.credit": "rloo", "rl.branch": False},
    "dr_grpo": {"rl.credit": "dr_grpo", "rl.branch": False},
    "gigpo": {"rl.credit": "gigpo", "rl.branch": False},
    "best_step": {"rl.credit": "best_step", "rl.branch": True},
    "starpo_s": {"rl.credit": "grpo", "rl.filter": "starpo_s", "rl.kl_coef": 0.0, "rl.clip_high": 0.28,
                 "rl.branch": False},
    "tree": {"rl.credit": "tree", "rl.tree": True, "rl.branch": False},
    "prm_gigpo": {"rl.credit": "prm", "rl.anchor_weight": 1.0, "rl.branch": False},
    **{name: {"rl.credit": name, "rl.branch": False} for name in ("turn_ppo", "archer", "prm", "implicit_prm", "istar")},
}

ERROR_TYPES = (
    ("arborl.config", "ConfigError"),
    ("arborl.trajectory.schema", "SchemaError"),
    ("arborl.store.base", "StoreError"),
    ("arborl.env.check", "EnvCheckError"),
    ("arborl.policy.chat", "TemplateError"),
    ("arborl.policy.portable", "CheckpointError"),
    ("arborl.sandbox.base", "SandboxError"),
)
"""arborl's own error types (module, class): bad input, reported in one line with exit code 2."""

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a run stopped by Ctrl-C


def credit_from_config(rl: RLConfig) -> Callable[..., Any]:
    """Bind the configured credit estimator to its options."""
    from arborl import credit
    from arborl.config import ConfigError

    if rl.credit not in CREDIT_ESTIMATORS:
        raise ConfigError(f"rl.credit = {rl.credit!r} is unknown; choose one of {sorted(CREDIT_ESTIMATORS)}")
    name, options = CREDIT_ESTIMATORS[rl.credit]
    return functools.partial(getattr(credit, name), **options(rl))


def credit_model_from_config(rl: RLConfig) -> Callable[..., Any] | None:
    """``(cfg, policy, tok) -> CreditModel`` for an ``rl.credit`` that trains a model; None for the others."""
    return CREDIT_MODELS.get(rl.credit)


def summary_table(summary: dict, console) -> None:
    """Print the evaluations in ``summary`` (one column each) and the run's totals."""
    from rich.table import Table

    from arborl.train.pipeline import EVAL_LABELS
    from arborl.train.profile import profile_lines

    evals = [k for k in EVAL_LABELS if k in summary]
    table = Table(title=f"arborl run: {summary['run_dir']}")
    table.add_column("metric")
    for label in [EVAL_LABELS[k] for k in evals] or ["run"]:
        table.add_column(label, justify="right")
    for key, label in (("success", "success rate (held-out)"), ("reward", "mean reward"),
                       ("turns", "mean turns"), ("invalid_frac", "invalid actions")):
        if evals:
            table.add_row(label, *[f"{summary[k][key]:.3f}" for k in evals])
    pad = [""] * max(0, len(evals) - 1)
    table.add_row("env steps", *pad, f"{summary.get('env_steps', 0):,}")
    table.add_row("tokens trained (RL)", *pad, f"{summary.get('tokens', 0):,}")
    table.add_row("wall time", *pad, f"{summary['wall_s']:.0f} s")
    table.add_row("peak RSS", *pad, f"{summary['peak_rss_mb']:.0f} MB")
    for label, value in profile_lines(summary.get("rl_profile", {})):
        table.add_row(label, *pad, value)
    console.print(table)
    for k in ("checkpoint", "init"):
        if f"{k}_path" in summary:
            console.print(f"{EVAL_LABELS[k]}: {summary[k + '_path']}")
    console.print(f"summary: {summary['run_dir']}/summary.json   curve: {summary['run_dir']}/learning_curve.png")


def _load(args: argparse.Namespace, stages: list[str] | None = None):
    from arborl.config import load_config
    from arborl.train.config import TrainConfig

    overrides = list(args.set or [])
    if stages is not None:
        overrides.append(f"stages={stages!r}".replace("'", '"'))
    return load_config(TrainConfig, args.config, overrides)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from arborl.train.pipeline import run_pipeline

    hf_logging.disable_progress_bar()  # our own bars show the stages; per-load bars are noise
    console = Console(stderr=False)
    cfg = _load(args, args.stages)
    summary = run_pipeline(cfg, credit_from_config(cfg.rl), resume=args.resume, overwrite=args.overwrite,
                           checkpoint=getattr(args, "checkpoint", None), console=console,
                           credit_model=credit_model_from_config(cfg.rl))
    summary_table(summary, console)
    return 0


def _config_show(args: argparse.Namespace) -> int:
    from arborl.config import config_keys

    print(f"# arborl config resolved from {args.config or 'the defaults'}"
          + (f" with --set {' '.join(args.set)}" if args.set else "") + "; `# default:` marks changed keys")
    sections: dict[str, list] = {}  # a section's own keys together, before its sub-tables (valid TOML)
    for k in config_keys(_load(args)):
        sections.setdefault(k.key.rpartition(".")[0], []).append(k)
    for head, keys in sections.items():
        if head:
            print(f"\n[{head}]")
        for k in keys:
            for line in k.help.splitlines():
                print(f"# {line}")
            note = "" if k.value == k.default else f"  # default: {_toml_value(k.default)}"
            print(f"{k.key.rpartition('.')[2]} = {_toml_value(k.value)}{note}")
    return 0


def _config_keys(args: argparse.Namespace) -> int:
    from arborl.config import config_keys
    from arborl.train.config import TrainConfig

    for k in config_keys(TrainConfig):
        first = k.help.split("\n\n")[0].replace("\n", " ")
        print(f"{k.key}  ({k.type}, default {_toml_value(k.default)})  {first}")
    return 0


def _toml_value(value: Any) -> str:
    """``value`` as TOML text on one line (tables inline); None, which TOML lacks, as ``""``."""
    import re

    import tomli_w

    if value is None:
        return '""'
    if isinstance(value, dict):
        items = [f"{k if re.fullmatch(r'[A-Za-z0-9_-]+', k) else _toml_value(k)} = {_toml_value(v)}"
                 for k, v in value.items()]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _add_config_commands(sub: Any) -> None:
    p = sub.add_parser("config", help="show the resolved config or list every key")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config (TOML) with each key's help and default")
    show.add_argument("config", nargs="?", help="TOML config file (none: the defaults)")
    show.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    show.set_defaults(func=_config_show)
    keys = csub.add_parser("keys", help="list every config key with its type, default and help")
    keys.set_defaults(func=_config_keys)


def build_parser() -> argparse.ArgumentParser:
    """The ``arborl`` argument parser (imports nothing heavy)."""
    p = argparse.ArgumentParser(prog="arborl", description="RL for multi-turn, tool-calling LLM agents.")
    p.add_argument("--version", action="version", version=f"arborl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("train", "run the configured pipeline (synth -> sft -> rl -> eval)"),
                        ("synth", "synthesize expert trajectories into the store"),
                        ("midtrain", "mid-training: continued pre-training on every token of packed trajectories"),
                        ("sft", "SFT cold start on stored trajectories"),
                        ("rl", "online RL from the SFT checkpoint (or the initial policy)"),
                        ("eval", "evaluate the run's SFT and RL checkpoints (or --checkpoint, or policy.init) "
                                 "on held-out tasks")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("config", help="TOML config file, e.g. examples/frozenlake.toml")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable), e.g. rl.lr=3e-4")
        if name == "eval":
            sp.add_argument("--checkpoint", metavar="PATH", help="evaluate this Hugging Face checkpoint directory "
                            "(e.g. RUN/checkpoints/rl-000050 or RUN/policy/sft)")
            sp.set_defaults(resume=False, overwrite=False)
        else:
            mode = sp.add_mutually_exclusive_group()
            mode.add_argument("--resume", action="store_true", help="continue the run in run_dir where it stopped")
            mode.add_argument("--overwrite", action="store_true",
                              help="replace what an earlier run left in run_dir for these stages")
        sp.set_defaults(func=_run, stages=None if name == "train" else [name])
    _add_config_commands(sub)
    from arborl.store.cli import add_store_commands

    add_store_commands(sub)
    from arborl.search.cli import add_search_commands

    add_search_commands(sub)
    from arborl.serve.cli import add_serve_command

    add_serve_command(sub)
    from arborl.train.compare import add_compare_command

    add_compare_command(sub)
    from arborl.view.cli import add_view_command

    add_view_command(sub)
    from arborl.merge.cli import add_merge_command

    add_merge_command(sub)
    return p


def _is_arborl_error(e: BaseException) -> bool:
    # a module that is not imported cannot have raised its error type, so none is imported here
    return any(mod in sys.modules and isinstance(e, getattr(sys.modules[mod], name)) for mod, name in ERROR_TYPES)


def main(argv: list[str] | None = None) -> int:
    """Run the ``arborl`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Interrupted as e:
        print(f"arborl: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("arborl: stopped (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if _is_arborl_error(e) or isinstance(e, FileNotFoundError):
            print(f"arborl: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


if __name__ == "__main__":
    sys.exit(main())
