"""arborl.sandbox."""
