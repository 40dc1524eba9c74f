"""arborl.rollout."""
