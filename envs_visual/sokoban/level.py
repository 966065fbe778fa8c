"""Sokoban levels as arrays, XSB text in and out, and the Boxoban file loader.

XSB notation: `#` wall, ` ` floor, `.` target, `$` box, `*` box on target, `@` player,
`+` player on target (`-` and `_` are read as floor too). Boxoban files hold levels headed by
`; N` lines (https://github.com/deepmind/boxoban-levels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Row/column offsets of the four actions, in action-id order.
ACTION_NAMES = ("Up", "Down", "Left", "Right")
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))

_FLOOR_CHARS = {" ", "-", "_"}
_XSB_CHARS = {"#", ".", "$", "*", "@", "+"} | _FLOOR_CHARS


@dataclass
class Level:
    """One Sokoban state. All arrays have shape (rows, cols); `player` is (row, col)."""

    walls: np.ndarray  # bool
    targets: np.ndarray  # bool
    boxes: np.ndarray  # bool
    player: tuple[int, int]

    def copy(self) -> Level:
        return Level(self.walls.copy(), self.targets.copy(), self.boxes.copy(), self.player)

    @property
    def shape(self) -> tuple[int, int]:
        return self.walls.shape

    def is_solved(self) -> bool:
        return bool(np.array_equal(self.boxes, self.targets))

    def layout_key(self) -> str:
        """The initial state as XSB: two levels are the same level iff their keys are equal."""
        return to_xsb(self)


def parse_xsb(xsb: str) -> Level:
    """Read one level from XSB text. Short rows are padded with floor; raises ValueError on bad input."""
    rows = [row for row in xsb.splitlines() if row.strip() and not row.lstrip().startswith(";")]
    if not rows:
        raise ValueError("empty XSB level")
    width = max(len(row) for row in rows)
    grid = np.array([list(row.ljust(width)) for row in rows])
    unknown = set(np.unique(grid)) - _XSB_CHARS
    if unknown:
        raise ValueError(f"XSB level has unknown characters {sorted(unknown)}")
    players = np.argwhere((grid == "@") | (grid == "+"))
    if len(players) != 1:
        raise ValueError(f"XSB level needs exactly one player, found {len(players)}")
    boxes = (grid == "$") | (grid == "*")
    targets = (grid == ".") | (grid == "*") | (grid == "+")
    if boxes.sum() != targets.sum() or boxes.sum() == 0:
        raise ValueError(f"XSB level needs as many boxes as targets (>0): {boxes.sum()} vs {targets.sum()}")
    row, col = players[0]
    return Level(walls=grid == "#", targets=targets, boxes=boxes, player=(int(row), int(col)))


def to_xsb(level: Level) -> str:
    """XSB text of a level, rows joined by newlines (no trailing newline)."""
    chars = np.full(level.shape, " ")
    chars[level.walls] = "#"
    chars[level.targets] = "."
    chars[level.boxes] = "$"
    chars[level.boxes & level.targets] = "*"
    row, col = level.player
    chars[row, col] = "+" if level.targets[row, col] else "@"
    return "\n".join("".join(line) for line in chars)


def load_boxoban(path: str | Path) -> list[str]:
    """XSB texts of all levels in a Boxoban file (levels headed by `; N` lines)."""
    levels: list[str] = []
    current: list[str] = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(";"):
            if current:
                levels.append("\n".join(current))
            current = []
        elif line.strip():
            current.append(line)
    if current:
        levels.append("\n".join(current))
    return levels
