"""arborl.store."""
