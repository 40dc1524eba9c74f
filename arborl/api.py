"""The Python API for notebooks and scripts: :func:`load_config` and :func:`train`, as the CLI runs them.

from arborl import load_config, train

cfg = load_config("examples/frozenlake.toml", ["rl.iterations=20"])
summary = train(cfg)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arborl.train.config import TrainConfig


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a training config: TOML file ``path`` (None: the defaults) with ``key=value`` overrides.

    Args:
        path: A TOML file such as ``examples/frozenlake.toml``.
        overrides: Dotted overrides as on the command line, e.g. ``["rl.lr=3e-4", 'run_dir="runs/a"']``.

    Raises:
        ConfigError: A missing file, bad TOML, an unknown key, a wrong type or a broken rule; the
            message names the key and the fix.
    """
    from arborl.config import load_config as load
    from arborl.train.config import TrainConfig

    return load(TrainConfig, path, overrides)


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, checkpoint: str | None = None,
          quiet: bool = False) -> dict[str, Any]:
    """Run ``cfg.stages`` (``synth -> sft -> rl -> eval``) as ``arborl train`` does; return the summary.

    Args:
        cfg: From :func:`load_config` (or built directly).
        resume: Continue the run in ``cfg.run_dir`` where it stopped.
        overwrite: Replace an earlier run in ``cfg.run_dir`` (without it or ``resume``, a used
            ``run_dir`` is refused).
        checkpoint: Evaluate this checkpoint directory in the eval stage.
        quiet: Print nothing (no messages, no table).

    Returns:
        The contents of ``run_dir/summary.json`` (keys in ``arborl.train.pipeline``).

    Raises:
        ConfigError: See :func:`arborl.train.pipeline.run_pipeline`.
        Interrupted: Ctrl-C (the kernel's interrupt in a notebook); ``resume=True`` continues.
    """
    from rich.console import Console

    from arborl.cli import credit_from_config, credit_model_from_config, summary_table
    from arborl.train.pipeline import run_pipeline

    console = None if quiet else Console()
    summary = run_pipeline(cfg, credit_from_config(cfg.rl), resume=resume, overwrite=overwrite,
                           checkpoint=checkpoint, console=console, credit_model=credit_model_from_config(cfg.rl))
    if console is not None:
        summary_table(summary, console)
    return summary
