"""Where metrics go: ``metrics.jsonl`` always, plus the loggers named in ``report_to``.

``report_to`` follows Hugging Face's key of the same name: ``tensorboard`` (``run_dir/tb``),
``wandb`` and ``mlflow``. The last two are optional extras and read their usual environment
variables: ``WANDB_MODE=offline`` writes the run under ``run_dir/wandb`` without a network,
``WANDB_PROJECT`` names the project (default ``arborl``); ``MLFLOW_TRACKING_URI`` picks the
tracking server (default: a local ``file:`` store in ``run_dir/mlruns``; arborl sets
``MLFLOW_ALLOW_FILE_STORE=true`` for a ``file:`` store, which MLflow 3 otherwise refuses), ``MLFLOW_EXPERIMENT_NAME``
the experiment (default ``arborl``). Every metric is logged as ``<stage>/<name>`` at the stage's
step (see :data:`arborl.train.common.METRICS`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from arborl.config import ConfigError


class Logger(Protocol):
    """A metrics destination."""

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        """Record ``values`` of ``stage`` at ``step``."""

    def close(self) -> None:
        """Flush and release."""


EXTRAS = {"tensorboard": ("tensorboard", "arborl"), "wandb": ("wandb", "arborl[wandb]"),
          "mlflow": ("mlflow", "arborl[mlflow]")}
"""For each ``report_to`` name: the module it needs and what to install for it."""


def check_loggers(report_to: list[str] | tuple[str, ...]) -> None:
    """Refuse (ConfigError, naming what to install) a ``report_to`` logger whose package is missing."""
    for name in report_to:
        module, package = EXTRAS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"report_to includes {name!r} but {module} is not installed; "
                              f"pip install '{package}' or remove it from report_to")


def _scalars(stage: str, values: dict[str, Any]) -> dict[str, float]:
    return {f"{stage}/{k}": float(v) for k, v in values.items() if isinstance(v, int | float)}


class TensorBoardLogger:
    """TensorBoard event files in ``run_dir/tb``."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(str(run_dir / "tb"))

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        """Add one scalar per value."""
        for k, v in _scalars(stage, values).items():
            self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        """Flush the event file."""
        self._tb.close()


class WandbLogger:
    """A Weights & Biases run (its files under ``run_dir/wandb``); ``WANDB_MODE=offline`` needs no network."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "arborl"), name=run_dir.name,
                               dir=str(run_dir), config=config, reinit="finish_previous")
        self._defined: set[str] = set()

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        """Log under ``<stage>/``, against the stage's own step axis ``<stage>/step``."""
        if stage not in self._defined:
            self._run.define_metric(f"{stage}/step")
            self._run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
            self._defined.add(stage)
        self._run.log({**_scalars(stage, values), f"{stage}/step": step})

    def close(self) -> None:
        """Finish the run (offline: the run folder is complete on disk)."""
        self._run.finish()


class MlflowLogger:
    """An MLflow run; without ``MLFLOW_TRACKING_URI`` a local ``file:`` tracking store in ``run_dir/mlruns``."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance and refuses it unless told; it needs no server
            # and no database driver, which is what a local run wants
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "arborl"))
        self._run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({k: str(v)[:500] for k, v in _flat(config).items()})

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        """Log under ``<stage>/`` at ``step``."""
        self._mlflow.log_metrics(_scalars(stage, values), step=step)

    def close(self) -> None:
        """End the run."""
        self._mlflow.end_run()


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


class Metrics:
    """Appends rows to ``run_dir/metrics.jsonl`` and hands them to the ``report_to`` loggers."""

    def __init__(self, run_dir: Path, report_to: list[str] | tuple[str, ...] = ("tensorboard",),
                 config: dict[str, Any] | None = None) -> None:
        check_loggers(report_to)
        self.path = run_dir / "metrics.jsonl"
        makers = {"tensorboard": lambda: TensorBoardLogger(run_dir),
                  "wandb": lambda: WandbLogger(run_dir, config or {}),
                  "mlflow": lambda: MlflowLogger(run_dir, config or {})}
        self._loggers: list[Logger] = []
        try:
            for name in report_to:
                self._loggers.append(makers[name]())
        except BaseException:
            self.close()
            raise

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        """Write one row (``stage``, ``step``, ``time`` and ``values``)."""
        row = {"stage": stage, "step": step, "time": time.time(), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for lg in self._loggers:
            lg.log(stage, step, values)

    def rows(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl``."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        """Close every logger."""
        for lg in self._loggers:
            lg.close()
        self._loggers = []
