"""Shortest (fewest moves) Sokoban solutions by breadth-first search over (boxes, player) states.

A state is one Python int, `boxes_mask << shift | player`: bit i of `boxes_mask` is set when cell i
(flat index row * cols + col) holds a box. Boxes are never pushed onto dead cells (cells from which
no sequence of pushes reaches a target, ignoring other boxes), which prunes states without losing
any solution, so the first solved state found is a shortest solution in moves.
"""

from __future__ import annotations

import numpy as np

from envs_visual.sokoban.level import MOVES, Level, parse_xsb

OPPOSITE = (1, 0, 3, 2)  # Up <-> Down, Left <-> Right


class SolverLimitError(RuntimeError):
    """The search visited more states than allowed without finding a solution."""


def neighbour_table(walls: np.ndarray) -> list[list[int]]:
    """For each flat cell, the flat index of its neighbour per action, or -1 for a wall/outside."""
    rows, cols = walls.shape
    padded_walls = np.ones((rows + 2, cols + 2), dtype=bool)
    padded_walls[1:-1, 1:-1] = walls
    padded_index = np.full((rows + 2, cols + 2), -1, dtype=np.int64)
    padded_index[1:-1, 1:-1] = np.arange(walls.size).reshape(rows, cols)
    table = np.empty((rows, cols, 4), dtype=np.int64)
    for action, (d_row, d_col) in enumerate(MOVES):
        window = (slice(1 + d_row, rows + 1 + d_row), slice(1 + d_col, cols + 1 + d_col))
        table[:, :, action] = np.where(padded_walls[window], -1, padded_index[window])
    return table.reshape(-1, 4).tolist()


def bitmask(cells: np.ndarray) -> int:
    """Bit i set iff the flat cell i is True."""
    return sum(1 << int(i) for i in np.flatnonzero(cells))


def live_cells(walls: np.ndarray, targets: np.ndarray) -> list[bool]:
    """Cells from which a lone box can be pushed to some target (reverse pulls from the targets)."""
    neighbours = neighbour_table(walls)
    live = [False] * walls.size
    stack = [int(i) for i in np.flatnonzero(targets)]
    for cell in stack:
        live[cell] = True
    while stack:
        cell = stack.pop()
        for action in range(4):
            # A box arrives at `cell` by a push in direction OPPOSITE[action] from `before`,
            # with the player standing one further cell back.
            before = neighbours[cell][action]
            if before < 0 or live[before]:
                continue
            if neighbours[before][action] >= 0:
                live[before] = True
                stack.append(before)
    return live


def solve(level: str | Level, max_states: int = 2_000_000) -> list[int] | None:
    """Shortest action list (ids into ACTION_NAMES) that solves `level`, or None if it has none.

    Raises SolverLimitError when more than `max_states` states were visited first.
    """
    if isinstance(level, str):
        level = parse_xsb(level)
    neighbours = neighbour_table(level.walls)
    live = live_cells(level.walls, level.targets)
    cols = level.shape[1]
    shift = level.walls.size.bit_length()
    player_mask = (1 << shift) - 1
    goal = bitmask(level.targets)
    boxes = bitmask(level.boxes)
    start = boxes << shift | (level.player[0] * cols + level.player[1])
    if boxes == goal:
        return []
    parents: dict[int, tuple[int, int]] = {start: (-1, -1)}
    frontier = [start]
    while frontier:
        next_frontier = []
        for state in frontier:
            boxes, player = state >> shift, state & player_mask
            for action, cell in enumerate(neighbours[player]):
                if cell < 0:
                    continue
                new_boxes = boxes
                if boxes >> cell & 1:
                    beyond = neighbours[cell][action]
                    if beyond < 0 or not live[beyond] or boxes >> beyond & 1:
                        continue
                    new_boxes = boxes ^ (1 << cell) | (1 << beyond)
                new_state = new_boxes << shift | cell
                if new_state in parents:
                    continue
                parents[new_state] = (state, action)
                if new_boxes == goal:
                    return _trace(parents, new_state)
                next_frontier.append(new_state)
        if len(parents) > max_states:
            raise SolverLimitError(f"no solution within {max_states} states")
        frontier = next_frontier
    return None


def _trace(parents: dict[int, tuple[int, int]], state: int) -> list[int]:
    actions = []
    previous, action = parents[state]
    while previous >= 0:
        actions.append(action)
        previous, action = parents[previous]
    return actions[::-1]
