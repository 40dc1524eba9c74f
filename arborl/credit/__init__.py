"""arborl.credit."""
