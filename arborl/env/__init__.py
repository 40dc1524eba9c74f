"""Environments behind a minimal interface, decoupled from training."""

from arborl.env.base import Env, StepResult
from arborl.env.check import EnvCheckError, check_env

__all__ = ["Env", "EnvCheckError", "StepResult", "check_env"]
