"""Environments behind a minimal interface, decoupled from training."""

from arborl.env.base import Env, StepResult
from arborl.env.check import EnvCheckError, check_env
from arborl.env.tool_env import Task, ToolEnv
from arborl.env.wrappers import EpisodeGuard, guard

__all__ = ["Env", "EnvCheckError", "EpisodeGuard", "StepResult", "Task", "ToolEnv", "check_env", "guard"]
