"""Images of grid worlds composed from tile PNGs (envs_visual/assets) with one numpy gather."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

ASSETS = Path(__file__).resolve().parent / "assets"


class TileRenderer:
    """Renders a grid of tile codes (rows, cols) as a uint8 image (rows * cell, cols * cell, 3).

    Tile k is `tile_names[k]`. Rendering is one fancy-indexing gather over the tile rows:
    image row (r * cell + y), column block c = row y of tile codes[r, c].
    """

    def __init__(self, tile_names: Sequence[str], cell_size: int = 28):
        if cell_size < 1:
            raise ValueError(f"cell_size must be >= 1, got {cell_size}")
        self.cell_size = cell_size
        tiles = [
            np.asarray(
                Image.open(ASSETS / f"{name}.png")
                .convert("RGB")
                .resize((cell_size, cell_size), Image.LANCZOS)
            )
            for name in tile_names
        ]
        self.tile_rows = np.stack(tiles).reshape(
            len(tiles) * cell_size, cell_size * 3
        )  # (K * cell, cell * 3)
        self._row_offsets = np.arange(cell_size)[None, :, None]  # (1, cell, 1)

    def render(self, codes: np.ndarray) -> np.ndarray:
        rows, cols = codes.shape
        index = codes[:, None, :] * self.cell_size + self._row_offsets  # (rows, cell, cols)
        image = self.tile_rows[index]  # (rows, cell, cols, cell * 3)
        return image.reshape(rows * self.cell_size, cols * self.cell_size, 3)
