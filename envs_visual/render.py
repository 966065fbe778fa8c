"""Images of grid worlds composed from tile PNGs (envs_visual/assets) with one numpy gather."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

ASSETS = Path(__file__).resolve().parent / "assets"


TILE_STYLES = ("sprites", "flat")
# The "flat" style: every cell one solid colour, the player filling its cell. Easier to see for a
# vision tower of a few hundred thousand parameters (the tiny recipes); real VLMs get the sprites.
FLAT_COLOURS = {
    "frozenlake_ice": (200, 230, 255),
    "frozenlake_start": (200, 230, 255),
    "frozenlake_hole": (10, 10, 60),
    "frozenlake_goal": (40, 200, 40),
    "frozenlake_player": (230, 30, 30),
    "frozenlake_player_in_hole": (120, 0, 60),
    "frozenlake_player_on_goal": (230, 200, 30),
    "sokoban_floor": (225, 225, 225),
    "sokoban_wall": (70, 70, 70),
    "sokoban_target": (250, 170, 170),
    "sokoban_box": (150, 90, 30),
    "sokoban_box_on_target": (40, 200, 40),
    "sokoban_player": (30, 60, 230),
    "sokoban_player_on_target": (140, 60, 230),
}


def tile_image(name: str, cell_size: int, style: str) -> np.ndarray:
    """One (cell, cell, 3) uint8 tile: the PNG in envs_visual/assets, or its flat colour."""
    if style == "flat":
        return np.full((cell_size, cell_size, 3), FLAT_COLOURS[name], np.uint8)
    image = Image.open(ASSETS / f"{name}.png").convert("RGB").resize((cell_size, cell_size), Image.LANCZOS)
    return np.asarray(image)


class TileRenderer:
    """Renders a grid of tile codes (rows, cols) as a uint8 image (rows * cell, cols * cell, 3).

    Tile k is `tile_names[k]` in `style` (TILE_STYLES). Rendering is one fancy-indexing gather over
    the tile rows: image row (r * cell + y), column block c = row y of tile codes[r, c].
    """

    def __init__(self, tile_names: Sequence[str], cell_size: int = 28, style: str = "sprites"):
        if cell_size < 1:
            raise ValueError(f"cell_size must be >= 1, got {cell_size}")
        if style not in TILE_STYLES:
            raise ValueError(f"tile style must be one of {TILE_STYLES}, got {style!r}")
        self.cell_size = cell_size
        tiles = [tile_image(name, cell_size, style) for name in tile_names]
        self.tile_rows = np.stack(tiles).reshape(
            len(tiles) * cell_size, cell_size * 3
        )  # (K * cell, cell * 3)
        self._row_offsets = np.arange(cell_size)[None, :, None]  # (1, cell, 1)

    def render(self, codes: np.ndarray) -> np.ndarray:
        rows, cols = codes.shape
        index = codes[:, None, :] * self.cell_size + self._row_offsets  # (rows, cell, cols)
        image = self.tile_rows[index]  # (rows, cell, cols, cell * 3)
        return image.reshape(rows * self.cell_size, cols * self.cell_size, 3)
