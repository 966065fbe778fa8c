"""Shortest distances on a text grid, shared by the grid envs (FrozenLake's teachers and exploring
starts, MiniGrid's random starts)."""

from __future__ import annotations

from collections import deque

SIDES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (row, col) steps to the four side-by-side cells


def goal_distances(grid: list[str], goal: str = "G", blocked: str = "H") -> dict[tuple[int, int], int]:
    """Fewest side-by-side steps from each (row, col) of `grid` (one string per row) to the nearest `goal`
    character, never through a `blocked` character (BFS from the goals). Cells that cannot reach a goal,
    and blocked cells, are absent."""
    rows, cols = len(grid), len(grid[0])
    goals = [(r, c) for r in range(rows) for c in range(cols) if grid[r][c] == goal]
    distance = dict.fromkeys(goals, 0)
    queue = deque(goals)
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in SIDES:
            r, c = row + d_row, col + d_col
            if 0 <= r < rows and 0 <= c < cols and grid[r][c] not in blocked and (r, c) not in distance:
                distance[(r, c)] = distance[(row, col)] + 1
                queue.append((r, c))
    return distance
