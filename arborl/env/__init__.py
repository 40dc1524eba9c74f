"""Environments behind a minimal interface, decoupled from training."""

from arborl.env.base import Env, StepResult

__all__ = ["Env", "StepResult"]
