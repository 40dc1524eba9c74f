"""arborl.loss."""
