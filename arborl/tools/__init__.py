"""arborl.tools."""
