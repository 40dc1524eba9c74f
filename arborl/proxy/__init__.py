"""arborl.proxy."""
