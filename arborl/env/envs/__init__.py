"""Built-in text environments: grid puzzles sized for tiny models and readable by LLMs."""

from arborl.env.envs.frozenlake import FrozenLake
from arborl.env.envs.frozenlake_image import FrozenLakeImage
from arborl.env.envs.sokoban import Sokoban

__all__ = ["FrozenLake", "FrozenLakeImage", "Sokoban"]
