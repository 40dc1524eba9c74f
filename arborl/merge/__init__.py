"""Model merging: linear, SLERP, task arithmetic, TIES and DARE over Hugging Face checkpoints.

The methods are pure tensor functions (:mod:`arborl.merge.methods`); ``merge_checkpoints`` in
:mod:`arborl.merge.checkpoint` streams them over checkpoints one tensor at a time. This package
module imports no torch, so the CLI's ``--help`` stays fast.
"""

from arborl.merge.config import METHODS, NEEDS_BASE, MergeConfig

__all__ = ["METHODS", "NEEDS_BASE", "MergeConfig"]
