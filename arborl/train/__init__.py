"""arborl.train."""
