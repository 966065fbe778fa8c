"""Procedural Sokoban levels by reverse play from a solved state, deterministic in a numpy Generator.

1. Carve a room: a random walk through the interior of an all-wall grid, clearing a small
   pattern at each step (the topology step of Schrader's gym-sokoban generator).
2. Put `num_boxes` boxes on random target cells: a solved state.
3. Reverse play: breadth-first search over *pulls* from every solved state at once (the player may
   stand on any free cell). The BFS depth of a state is then exactly its optimal solution length
   in moves, so no separate solver run is needed.
4. Keep a state from the deepest layer (or from a random layer in [min_steps, max_steps] when a
   curriculum range is given); retry with a new room when no layer qualifies.

A small room takes microseconds, so everything between the one `rng.random` call per room and the
final `Level` arrays is plain Python on int bitmasks over flat cells (cell = row * cols + col):
the floor is one int, a search state is one int `boxes_mask << shift | player` (bit i of
`boxes_mask` set when cell i holds a box, shift = (rows * cols).bit_length()), and the tables that
depend only on the room size, or only on the room, are built once and cached.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from envs_visual.sokoban.level import MOVES, Level

# Cells cleared around the walker at each step, as (row, col) offsets; one pattern is drawn per step.
CARVE_PATTERNS = (
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
)
Move = tuple[int, int, int]  # (step, box_bit, pull_xor), see local_moves


@lru_cache(maxsize=64)
def walk_tables(rows: int, cols: int) -> tuple[tuple[list[int], ...], tuple[list[int], ...], list[int]]:
    """Per room size, for the carver: carve[pattern][cell] (floor bits the pattern clears around an
    interior cell, border bits dropped), walk[direction][cell] (the walker's next cell; it stays put
    at the border) and the interior cells."""
    interior = [row * cols + col for row in range(1, rows - 1) for col in range(1, cols - 1)]
    carve = [[0] * (rows * cols) for _ in CARVE_PATTERNS]
    walk = [[0] * (rows * cols) for _ in MOVES]
    for cell in interior:
        row, col = divmod(cell, cols)
        for pattern, offsets in enumerate(CARVE_PATTERNS):
            for d_row, d_col in offsets:
                if 0 < row + d_row < rows - 1 and 0 < col + d_col < cols - 1:
                    carve[pattern][cell] |= 1 << (row + d_row) * cols + col + d_col
        for direction, (d_row, d_col) in enumerate(MOVES):
            next_row, next_col = min(max(row + d_row, 1), rows - 2), min(max(col + d_col, 1), cols - 2)
            walk[direction][cell] = next_row * cols + next_col
    return tuple(carve), tuple(walk), interior


def carve_floor(draws: list[float], rows: int, cols: int, p_turn: float) -> int:
    """Floor bitmask (bit `row * cols + col` set = floor) carved by a random walk; the border stays wall.

    draws: 3 uniforms for the start (row, col, direction), then 3 per step (turn?, new direction,
    pattern); the pattern is cleared around the walker before it moves.
    """
    carve, walk, _ = walk_tables(rows, cols)
    cell = (1 + int(draws[0] * (rows - 2))) * cols + 1 + int(draws[1] * (cols - 2))
    step_to = walk[int(draws[2] * 4)]
    num_patterns, floor = len(carve), 0
    for turn, new_direction, pattern in zip(draws[3::3], draws[4::3], draws[5::3], strict=True):
        floor |= carve[int(pattern * num_patterns)][cell]
        if turn < p_turn:
            step_to = walk[int(new_direction * 4)]
        cell = step_to[cell]
    return floor


@lru_cache(maxsize=64)
def local_moves(rows: int, cols: int) -> list[dict[int, tuple[Move, ...]]]:
    """Per room size: local[player][neighbours] = the reverse moves of a player on an interior cell,
    given `neighbours = floor >> player - cols - 1 & neighbour_bits(cols)` (its 4 neighbours' floor bits).

    A move (step, box_bit, pull_xor): the player steps to the floor neighbour `player + step` unless
    the state has `box_bit` (1 << (player + step + shift)) set, so the new state is `state + step`.
    When the cell behind the player (on the far side) holds a box, the player may also pull it
    along: the new state is `(state ^ pull_xor) + step`, pull_xor moving that box bit onto the
    player's cell; pull_xor = 0 when the cell behind is a wall, so `state & pull_xor` is false.
    """
    shift = (rows * cols).bit_length()
    steps = (-cols, cols, -1, 1)  # Up, Down, Left, Right
    offsets = [step + cols + 1 for step in steps]  # bit of each neighbour in `neighbours`
    local: list[dict[int, tuple[Move, ...]]] = [{} for _ in range(rows * cols)]
    for player in walk_tables(rows, cols)[2]:
        for present in range(16):  # which of the 4 neighbours are floor
            is_floor = {step: present >> k & 1 for k, step in enumerate(steps)}
            key = sum(1 << offset for k, offset in enumerate(offsets) if present >> k & 1)
            local[player][key] = tuple(
                (
                    step,
                    1 << player + step + shift,
                    (1 << player - step + shift | 1 << player + shift) * is_floor[-step],
                )
                for step in steps
                if is_floor[step]
            )
    return local


def neighbour_bits(cols: int) -> int:
    """Mask of the 4 neighbours of cell cols + 1 (the up, left, right, down bits used by local_moves)."""
    return 1 << 1 | 1 << cols | 1 << cols + 2 | 1 << 2 * cols + 1


@lru_cache(maxsize=4096)
def room_moves(floor: int, rows: int, cols: int) -> tuple[tuple[Move, ...], ...]:
    """moves[player]: the reverse moves of a player on each flat cell of this room (cached by floor)."""
    local = local_moves(rows, cols)
    around = neighbour_bits(cols)
    moves: list[tuple[Move, ...]] = [()] * (rows * cols)
    for player in walk_tables(rows, cols)[2]:
        if floor >> player & 1:
            moves[player] = local[player][floor >> player - cols - 1 & around]
    return tuple(moves)


def reverse_search(
    moves: tuple[tuple[Move, ...], ...], solved: int, free: list[int], max_depth: int, max_states: int
) -> list[list[int]]:
    """BFS layers of states (`boxes_mask << shift | player`) by pulls from all solved states.

    moves: the room's reverse moves (room_moves); solved: the target mask shifted into box position;
    free: the floor cells that are not targets. Layer d holds the states whose shortest forward
    solution takes exactly d moves, in first-found order; the search stops after layer `max_depth`
    or once `max_states` states were found.
    """
    player_mask = (1 << len(moves).bit_length()) - 1
    layer = [solved | cell for cell in free]
    seen = set(layer)
    layers = [layer]
    if max_depth >= 1:  # a plain step from a solved state stays in layer 0, so layer 1 is its pulls
        layer = [
            (state ^ pull) + step
            for state in layer
            for step, box_bit, pull in moves[state & player_mask]
            if state & pull and not state & box_bit
        ]
        seen.update(layer)
        if layer:
            layers.append(layer)
    while layer and len(layers) <= max_depth and len(seen) < max_states:
        next_layer = []
        for state in layer:
            for step, box_bit, pull in moves[state & player_mask]:
                if state & box_bit:
                    continue
                if (moved := state + step) not in seen:
                    seen.add(moved)
                    next_layer.append(moved)
                if state & pull and (pulled := (state ^ pull) + step) not in seen:
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
    lowest = max(min_steps, 1)
    shift = (rows * cols).bit_length()
    interior = walk_tables(rows, cols)[2]
    num_draws = 3 * (walk_steps + 1)  # for the carver; then num_boxes for the targets, 2 for the pick
    for _ in range(max_tries):
        draws = rng.random(num_draws + num_boxes + 2).tolist()
        floor = carve_floor(draws[:num_draws], rows, cols, p_turn)
        cells = [cell for cell in interior if floor >> cell & 1]
        if len(cells) < num_boxes + 2:
            continue
        for k in range(num_boxes):  # partial Fisher-Yates shuffle: cells[:num_boxes] become targets
            j = k + int(draws[num_draws + k] * (len(cells) - k))
            cells[k], cells[j] = cells[j], cells[k]
        solved = sum(1 << cell + shift for cell in cells[:num_boxes])
        layers = reverse_search(room_moves(floor, rows, cols), solved, cells[num_boxes:], top, max_states)
        if len(layers) <= lowest:
            continue
        pick_depth, pick_state = draws[-2:]
        depth = len(layers) - 1 if max_steps is None else lowest + int(pick_depth * (len(layers) - lowest))
        layer = layers[depth]
        return _decode(layer[int(pick_state * len(layer))], floor, solved, dim_room), depth
    raise RuntimeError(f"no {dim_room} level with {num_boxes} boxes in [{min_steps}, {max_steps}] steps")


def _decode(state: int, floor: int, solved: int, dim_room: tuple[int, int]) -> Level:
    """The Level of a search state: walls, targets and boxes unpacked from one int in one numpy call."""
    size = dim_room[0] * dim_room[1]
    shift = size.bit_length()
    walls = floor ^ (1 << size) - 1
    packed = walls | (solved >> shift) << size | (state >> shift) << 2 * size  # 3 * size bits
    flags = np.unpackbits(
        np.frombuffer(packed.to_bytes((3 * size + 7) // 8, "little"), dtype=np.uint8),
        count=3 * size,
        bitorder="little",
    )
    walls_array, targets, boxes = flags.view(bool).reshape(3, *dim_room)
    return Level(walls_array, targets, boxes, divmod(state & (1 << shift) - 1, dim_room[1]))
