"""Trajectory records: episode trees of turns, serialization, linear views for training."""

from arborl.trajectory.canonical import content_hash
from arborl.trajectory.schema import (
    EPISODE_FIELDS,
    SCHEMA_VERSION,
    STOP_REASONS,
    TURN_FIELDS,
    Episode,
    LinearView,
    MediaRef,
    Origin,
    SchemaError,
    StopReason,
    ToolCall,
    Turn,
    linearize,
    new_id,
)

__all__ = [
    "EPISODE_FIELDS",
    "SCHEMA_VERSION",
    "STOP_REASONS",
    "TURN_FIELDS",
    "Episode",
    "LinearView",
    "MediaRef",
    "Origin",
    "SchemaError",
    "StopReason",
    "ToolCall",
    "Turn",
    "content_hash",
    "linearize",
    "new_id",
]
