"""Visual Sokoban as a gymnasium env: generated or given XSB levels, image + XSB observations."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from envs_visual.facts import Fact, relative_facts
from envs_visual.render import TileRenderer
from envs_visual.sokoban.generator import generate_level
from envs_visual.sokoban.level import ACTION_NAMES, MOVES, Level, parse_xsb, to_xsb
from envs_visual.sokoban.solver import SolverLimitError, solve

# Tile code = target + 2 * box + 4 * player on non-wall cells; WALL_CODE on walls.
TILE_NAMES = (
    "sokoban_floor",
    "sokoban_target",
    "sokoban_box",
    "sokoban_box_on_target",
    "sokoban_player",
    "sokoban_player_on_target",
    "sokoban_wall",
)
WALL_CODE = 6
XSB_CHARSET = " #.$*@+\n"

INSTRUCTION = (
    "You are playing Sokoban. Push every box onto a target. You move one cell per action and push a "
    "box by walking into it; a box moves only if the cell beyond it is free (no wall, no other box). "
    "Boxes cannot be pulled, so a box pushed into a corner is stuck."
)
IMAGE_LEGENDS = {
    "sprites": "In the image: brown bricks are walls, grey cells are floor, red rings are targets, "
    "orange crates are boxes, green crates are boxes on targets, and the blue figure is you, the player.",
    "flat": "In the image: dark grey cells are walls, light grey cells are floor, pink cells are "
    "targets, brown cells are boxes, green cells are boxes on targets, and the blue cell is you "
    "(purple when you stand on a target).",
}
TEXT_LEGEND = (
    "In the grid: '#' wall, ' ' floor, '.' target, '$' box, '*' box on target, '@' player, "
    "'+' player on target. Row 1 is the top row."
)


class SokobanEnv(gymnasium.Env):
    """Sokoban with Discrete(4) actions ("Up", "Down", "Left", "Right").

    Rewards: `step_reward` per step, `box_on_target_reward` when a box lands on a target,
    -`box_on_target_reward` when one leaves, `solved_reward` when all boxes are on targets.
    Terminates when solved; truncates after `max_steps` steps.
    info: success, boxes_on_target, action_is_effective, optimal_steps (None when unknown: a given
    level the solver could not finish within `solver_max_states`).
    Images: `cell_size` pixels per cell, `tile_style` "sprites" (the PNGs in envs_visual/assets) or
    "flat" (one solid colour per cell; envs_visual.render.FLAT_COLOURS).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    action_names = ACTION_NAMES
    instruction = INSTRUCTION
    supports_random_start = True
    text_legend = TEXT_LEGEND
    example_facts = (("box", "below"), ("box", "same column"), ("target", "below"), ("target", "left"))

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        search_depth: int = 100,
        search_max_states: int = 20_000,
        min_optimal_steps: int = 1,
        max_optimal_steps: int | None = None,
        cell_size: int = 28,
        step_reward: float = -0.1,
        box_on_target_reward: float = 1.0,
        solved_reward: float = 10.0,
        solver_max_states: int = 200_000,
        tile_style: str = "sprites",
        render_mode: str | None = "rgb_array",
    ):
        self.dim_room = tuple(dim_room)
        self.num_boxes = num_boxes
        self.max_steps = max_steps
        self.generator_options = dict(
            dim_room=self.dim_room,
            num_boxes=num_boxes,
            search_depth=search_depth,
            max_states=search_max_states,
            min_steps=min_optimal_steps,
            max_steps=max_optimal_steps,
        )
        self.step_reward = step_reward
        self.box_on_target_reward = box_on_target_reward
        self.solved_reward = solved_reward
        self.solver_max_states = solver_max_states
        self.render_mode = render_mode
        self.renderer = TileRenderer(TILE_NAMES, cell_size, tile_style)
        self.image_legend = IMAGE_LEGENDS[tile_style]
        rows, cols = self.dim_room
        self.action_space = spaces.Discrete(4)
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (rows * cell_size, cols * cell_size, 3), np.uint8),
                "text": spaces.Text(max_length=rows * (cols + 1), charset=XSB_CHARSET),
            }
        )
        self.level: Level | None = None
        self.layout_key = ""
        self.optimal_steps: int | None = None
        self.num_steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options: {"level": xsb} plays the given level instead of generating one from the seed;
        {"random_start": q} starts, with probability q, on a state drawn uniformly from those a shortest
        solution passes through before it solves the level (the start included): exploring starts for
        training, as FrozenLake's. The draws come from the reset seed after the level's, so a seed
        gives the same level with or without them and the members of a group share the start."""
        super().reset(seed=seed)
        options = options or {}
        if "level" in options:
            level = parse_xsb(options["level"])
            if level.shape != self.dim_room:
                raise ValueError(f"level is {level.shape}, env is {self.dim_room}: make it with dim_room=")
            self.optimal_steps = self._solve_length(level)
        else:
            level, self.optimal_steps = generate_level(self.np_random, **self.generator_options)
        self.level = level
        self.layout_key = level.layout_key()
        self._static_codes = np.where(level.walls, WALL_CODE, level.targets.astype(np.int64))
        start_draw, start_pick = self.np_random.random(), self.np_random.random()
        if start_draw < float(options.get("random_start", 0.0)) and self.optimal_steps:
            path = self.optimal_actions(self.optimal_steps)
            skipped = int(start_pick * len(path))
            for action in path[:skipped]:
                self.step(action)
            self.optimal_steps -= skipped
        self.num_steps = 0
        return self._observation(), self._info(action_is_effective=False)

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, 4), got {action!r}")
        level = self.level
        d_row, d_col = MOVES[int(action)]
        row, col = level.player
        ahead, beyond = (row + d_row, col + d_col), (row + 2 * d_row, col + 2 * d_col)
        reward, moved = self.step_reward, False
        if self._free(ahead):
            moved = True
        elif self._inside(ahead) and level.boxes[ahead] and self._free(beyond):
            level.boxes[ahead], level.boxes[beyond] = False, True
            reward += self.box_on_target_reward * (int(level.targets[beyond]) - int(level.targets[ahead]))
            moved = True
        if moved:
            level.player = ahead
        self.num_steps += 1
        terminated = level.is_solved()
        if terminated:
            reward += self.solved_reward
        truncated = not terminated and self.num_steps >= self.max_steps
        return self._observation(), reward, terminated, truncated, self._info(action_is_effective=moved)

    def render(self) -> np.ndarray:
        codes = self._static_codes + 2 * self.level.boxes
        codes[self.level.player] += 4
        return self.renderer.render(codes)

    def describe_state(self) -> list[Fact]:
        """Facts relative to the player: every box, then every target (see envs_visual.facts)."""
        level = self.level
        boxes = [tuple(cell) for cell in np.argwhere(level.boxes)]
        targets = [tuple(cell) for cell in np.argwhere(level.targets)]
        return relative_facts("box", boxes, level.player) + relative_facts("target", targets, level.player)

    def text_grid(self) -> str:
        return to_xsb(self.level)

    def state_features(self) -> np.ndarray:
        """The true state as one-hots for a privileged critic (the policy never sees it): wall, target,
        box and player planes of the room, each row-major; float32 (4 * rows * cols,)."""
        level = self.level
        player = np.zeros(level.shape, dtype=bool)
        player[level.player] = True
        return np.concatenate(
            [plane.ravel() for plane in (level.walls, level.targets, level.boxes, player)]
        ).astype(np.float32)

    def optimal_actions(self, max_actions: int) -> list[int]:
        """Teacher: the first `max_actions` moves of a shortest solution from the current state
        (envs_visual.sokoban.solve); [] when solved, unsolvable (a box stuck) or past `solver_max_states`."""
        try:
            solution = solve(self.level, max_states=self.solver_max_states)
        except SolverLimitError:
            return []
        return [] if solution is None else solution[:max_actions]

    def _inside(self, cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < self.dim_room[0] and 0 <= cell[1] < self.dim_room[1]

    def _free(self, cell: tuple[int, int]) -> bool:
        return self._inside(cell) and not self.level.walls[cell] and not self.level.boxes[cell]

    def _observation(self) -> dict[str, Any]:
        return {"image": self.render(), "text": self.text_grid()}

    def _info(self, action_is_effective: bool) -> dict[str, Any]:
        return {
            "success": self.level.is_solved(),
            "boxes_on_target": int((self.level.boxes & self.level.targets).sum()),
            "action_is_effective": action_is_effective,
            "optimal_steps": self.optimal_steps,
        }

    def _solve_length(self, level: Level) -> int | None:
        try:
            solution = solve(level, max_states=self.solver_max_states)
        except SolverLimitError:
            return None
        return None if solution is None else len(solution)
