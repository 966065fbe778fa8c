"""MiniGrid (Farama's `minigrid`) through the env contract: its dynamics, our image and text views."""

from envs_visual.minigrid.env import TASKS, MiniGridEnv

__all__ = ["TASKS", "MiniGridEnv"]
