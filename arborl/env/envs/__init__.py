"""arborl.env.envs."""
