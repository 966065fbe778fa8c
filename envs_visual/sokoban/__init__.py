"""Sokoban: levels (XSB, Boxoban files), reverse-play generator, shortest-path solver, gymnasium env."""

from envs_visual.sokoban.env import SokobanEnv
from envs_visual.sokoban.generator import generate_level
from envs_visual.sokoban.level import ACTION_NAMES, Level, load_boxoban, parse_xsb, to_xsb
from envs_visual.sokoban.solver import SolverLimitError, solve

__all__ = [
    "ACTION_NAMES",
    "Level",
    "SokobanEnv",
    "SolverLimitError",
    "generate_level",
    "load_boxoban",
    "parse_xsb",
    "solve",
    "to_xsb",
]
