"""Trajectory records: episode trees of turns, serialization, linear views for training."""

from arborl.trajectory.schema import (
    SCHEMA_VERSION,
    Episode,
    LinearView,
    MediaRef,
    SchemaError,
    ToolCall,
    Turn,
    linearize,
    new_id,
)

__all__ = [
    "SCHEMA_VERSION",
    "Episode",
    "LinearView",
    "MediaRef",
    "SchemaError",
    "ToolCall",
    "Turn",
    "linearize",
    "new_id",
]
