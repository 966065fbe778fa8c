"""VAGEN: multi-turn RL for vision-language agents."""

from vagen import _torchvision_shim  # noqa: F401  (arms the CPU torchvision hook; imports no torch)

__version__ = "0.1.0"
