"""arborl.rollout: batched multi-turn episodes with a KV cache kept across turns."""

from arborl.rollout.config import EpisodeSpec, RolloutConfig, SamplingConfig
from arborl.rollout.engine import run_episodes
from arborl.rollout.generate import LMSession, TurnOutput, TurnRequest
from arborl.rollout.policy import ModelPolicy, Policy, PolicySession, ScriptedPolicy
from arborl.rollout.sampling import sample_next

__all__ = [
    "EpisodeSpec",
    "LMSession",
    "ModelPolicy",
    "Policy",
    "PolicySession",
    "RolloutConfig",
    "SamplingConfig",
    "ScriptedPolicy",
    "TurnOutput",
    "TurnRequest",
    "run_episodes",
    "sample_next",
]
