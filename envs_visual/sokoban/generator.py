"""Procedural Sokoban levels by reverse play from a solved state, deterministic in a numpy Generator.

1. Carve a room: a random walk through the interior of an all-wall grid, clearing a small
   pattern at each step (the topology step of Schrader's gym-sokoban generator).
2. Put `num_boxes` boxes on random target cells: a solved state.
3. Reverse play: breadth-first search over *pulls* from every solved state at once (the player may
   stand on any free cell). The BFS depth of a state is then exactly its optimal solution length
   in moves, so no separate solver run is needed.
4. Keep a state from the deepest layer (or from a random layer in [min_steps, max_steps] when a
   curriculum range is given); retry with a new room when no layer qualifies.
"""

from __future__ import annotations

import numpy as np

from envs_visual.sokoban.level import MOVES, Level
from envs_visual.sokoban.solver import OPPOSITE, bitmask, neighbour_table

# Offsets (row, col) cleared around the walker at each step; one pattern is drawn per step.
# Patterns are padded to four offsets by repeating (0, 0) so that all steps carve in one array op.
CARVE_PATTERNS = np.array(
    [
        [(0, 0), (0, 0), (0, 0), (0, 0)],
        [(0, 0), (0, 1), (0, 0), (0, 0)],
        [(0, 0), (1, 0), (0, 0), (0, 0)],
        [(0, 0), (0, 1), (1, 0), (1, 1)],
        [(0, -1), (0, 0), (0, 1), (0, 0)],
        [(-1, 0), (0, 0), (1, 0), (0, 0)],
    ]
)  # (patterns, 4, 2)


def carve_room(rng: np.random.Generator, dim_room: tuple[int, int], walk_steps: int, p_turn: float):
    """Bool wall array (rows, cols) with a connected floor carved by a random walk; border stays wall."""
    rows, cols = dim_room
    uniforms = rng.random((walk_steps + 1, 3))  # (steps + 1, [turn?, new direction, pattern])
    draws = uniforms.tolist()  # Python floats: the walk below is a scalar loop
    row, col = 1 + int(draws[0][0] * (rows - 2)), 1 + int(draws[0][1] * (cols - 2))
    direction = int(draws[0][2] * 4)
    path = []
    for turn, new_direction, _ in draws[1:]:
        path.append((row, col))
        if turn < p_turn:
            direction = int(new_direction * 4)
        d_row, d_col = MOVES[direction]
        if 0 < row + d_row < rows - 1:
            row += d_row
        if 0 < col + d_col < cols - 1:
            col += d_col
    patterns = CARVE_PATTERNS[(uniforms[1:, 2] * len(CARVE_PATTERNS)).astype(np.int64)]  # (steps, 4, 2)
    cells = np.array(path)[:, None, :] + patterns  # (steps, 4, 2), may touch the border
    walls = np.ones(dim_room, dtype=bool)
    walls[cells[..., 0], cells[..., 1]] = False
    walls[[0, -1], :] = True
    walls[:, [0, -1]] = True
    return walls


def reverse_search(
    walls: np.ndarray, targets: np.ndarray, max_depth: int, max_states: int
) -> list[list[int]]:
    """BFS layers of states (`boxes_mask << shift | player`) by pulls from all solved states.

    Layer d holds the states whose shortest forward solution takes exactly d moves.
    """
    neighbours = neighbour_table(walls)
    shift = walls.size.bit_length()
    player_mask = (1 << shift) - 1
    solved = bitmask(targets)
    layer = [solved << shift | int(cell) for cell in np.flatnonzero(~walls & ~targets)]
    seen = set(layer)
    layers = [layer]
    while layer and len(layers) <= max_depth and len(seen) < max_states:
        next_layer = []
        for state in layer:
            boxes, player = state >> shift, state & player_mask
            for action, cell in enumerate(neighbours[player]):
                if cell < 0 or boxes >> cell & 1:
                    continue
                moved = boxes << shift | cell
                if moved not in seen:
                    seen.add(moved)
                    next_layer.append(moved)
                behind = neighbours[player][OPPOSITE[action]]
                if behind >= 0 and boxes >> behind & 1:
                    pulled = (boxes ^ (1 << behind) | (1 << player)) << shift | cell
                    if pulled not in seen:
                        seen.add(pulled)
                        next_layer.append(pulled)
        layer = next_layer
        if layer:
            layers.append(layer)
    return layers


def generate_level(
    rng: np.random.Generator,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 100,
    max_states: int = 20_000,
    min_steps: int = 1,
    max_steps: int | None = None,
    walk_steps: int | None = None,
    p_turn: float = 0.35,
    max_tries: int = 1000,
) -> tuple[Level, int]:
    """A solvable level and its optimal solution length in moves.

    search_depth: deepest reverse-play layer explored (bounds the optimal length).
    max_states: stop the reverse search after this many states (bounds the time per room).
    min_steps, max_steps: keep only levels whose optimal length lies in [min_steps, max_steps];
        max_steps=None takes the deepest layer found (the hardest level of the room).
    walk_steps: random-walk length of the room carver, default 1.5 * (rows + cols).
    """
    rows, cols = dim_room
    if rows < 3 or cols < 3 or num_boxes < 1:
        raise ValueError(f"need dim_room >= (3, 3) and num_boxes >= 1, got {dim_room}, {num_boxes}")
    if max_steps is not None and max_steps < min_steps:
        raise ValueError(f"max_steps {max_steps} < min_steps {min_steps}")
    walk_steps = walk_steps or int(1.5 * (rows + cols))
    top = search_depth if max_steps is None else min(search_depth, max_steps)
    for _ in range(max_tries):
        walls = carve_room(rng, dim_room, walk_steps, p_turn)
        floor = np.flatnonzero(~walls)
        if len(floor) < num_boxes + 2:
            continue
        targets = np.zeros(dim_room, dtype=bool)
        targets.flat[floor[np.argsort(rng.random(len(floor)))[:num_boxes]]] = True
        layers = reverse_search(walls, targets, top, max_states)
        depths = [d for d in range(max(min_steps, 1), len(layers)) if layers[d]]
        if not depths:
            continue
        pick_depth, pick_state = rng.random(2)
        depth = depths[-1] if max_steps is None else depths[int(pick_depth * len(depths))]
        layer = layers[depth]
        state = layer[int(pick_state * len(layer))]
        return _decode(state, walls, targets), depth
    raise RuntimeError(f"no {dim_room} level with {num_boxes} boxes in [{min_steps}, {max_steps}] steps")


def _decode(state: int, walls: np.ndarray, targets: np.ndarray) -> Level:
    shift = walls.size.bit_length()
    player = state & ((1 << shift) - 1)
    boxes_mask = state >> shift
    boxes = np.array([boxes_mask >> i & 1 for i in range(walls.size)], dtype=bool).reshape(walls.shape)
    return Level(walls=walls, targets=targets, boxes=boxes, player=divmod(player, walls.shape[1]))
