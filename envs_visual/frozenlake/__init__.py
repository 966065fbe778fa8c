"""FrozenLake on gymnasium's dynamics and map generator, with image and text-grid observations."""

from envs_visual.frozenlake.env import ACTION_NAMES, VisualFrozenLakeEnv, shortest_path_length

__all__ = ["ACTION_NAMES", "VisualFrozenLakeEnv", "shortest_path_length"]
