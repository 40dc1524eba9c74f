"""arborl.policy."""
