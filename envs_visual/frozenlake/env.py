"""Visual FrozenLake: gymnasium's FrozenLakeEnv dynamics on seeded random maps, image + grid observations.

The map comes from the reset seed (gymnasium's `generate_random_map(size, p, seed)`); slips come
from the wrapped FrozenLakeEnv's own RNG, seeded with `options["dynamics_seed"]` when given, so the
members of a group can share a map and still slip differently.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from envs_visual.facts import Fact, adjacent_facts, relative_facts
from envs_visual.frozenlake.planning import (
    GYM_ACTIONS,
    SlipperyPlan,
    shortest_path_actions,
    value_iteration,
)
from envs_visual.paths import goal_distances
from envs_visual.render import TileRenderer

ACTION_NAMES = ("Up", "Down", "Left", "Right")

# Tile codes: the cell letter's code, or a player code on the player's cell.
TILE_NAMES = (
    "frozenlake_ice",
    "frozenlake_hole",
    "frozenlake_goal",
    "frozenlake_start",
    "frozenlake_player",
    "frozenlake_player_in_hole",
    "frozenlake_player_on_goal",
)
LETTER_CODES = {"F": 0, "H": 1, "G": 2, "S": 3}
PLAYER_CODES = {"F": 4, "S": 4, "H": 5, "G": 6}
GRID_CHARSET = "SFHGP\n"
FEATURE_TILES = {"F": 0, "S": 0, "H": 1, "G": 2}  # state_features' tile channels: ice (start too), hole, goal
# state_features(): the map row-major + the player's cell, or the map seen from the player
STATE_VIEWS = ("layout", "egocentric")

INSTRUCTION = (
    "You are playing FrozenLake. Walk from the start to the goal over the frozen lake without "
    "falling into a hole. You move one cell per action; moving into the edge leaves you in place."
)
SLIPPERY_NOTE = " The ice is slippery: a move may carry you sideways instead of where you meant to go."
IMAGE_LEGENDS = {
    "sprites": "In the image: light blue cells are ice, dark blue ovals are holes, the gift box is the "
    "goal, the green frame is the start, and the orange figure is you, the player.",
    "flat": "In the image: light blue cells are ice, dark blue cells are holes, the green cell is the "
    "goal, and the red cell is you, the player.",
}
TEXT_LEGEND = "In the grid: 'P' you, 'S' start, 'F' frozen ice, 'H' hole, 'G' goal. Row 1 is the top row."


def shortest_path_length(desc: list[str]) -> int | None:
    """Fewest moves from S to G on the non-slippery map, stepping on no hole (BFS); None if none."""
    start = next((r, c) for r, line in enumerate(desc) for c, letter in enumerate(line) if letter == "S")
    return goal_distances(desc).get(start)


class VisualFrozenLakeEnv(gymnasium.Env):
    """FrozenLake with actions ("Up", "Down", "Left", "Right") and {"image", "text"} observations.

    Terminates in a hole or on the goal (gymnasium's rules and rewards, `reward_schedule`
    = (goal, hole, frozen)); truncates after `max_steps` steps. `progress_reward` c > 0 adds the
    shaping c * (d(s) - d(s')) per step, d = Manhattan distance from the player to the goal: a
    difference of potentials whose sum over an episode is c * (d(start) - d(end)), so it cannot be
    farmed by walking back and forth (a fall keeps the progress made; it reads the goal, not the holes).
    `timeout_reward` is added on the step that truncates the episode: set equal to the hole's reward,
    a run out of time fails like a fall, so a hole penalty no longer pays the agent to stall.
    info: success, optimal_steps (BFS on the non-slippery map, from the episode's start),
    action_is_effective.
    Images: `cell_size` pixels per cell, `tile_style` "sprites" (the PNGs in envs_visual/assets) or
    "flat" (one solid colour per cell; envs_visual.render.FLAT_COLOURS).
    `state_view` picks the privileged critic's `state_features()`: "layout" or "egocentric".
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    supports_random_start = True
    action_names = ACTION_NAMES
    text_legend = TEXT_LEGEND
    example_facts = (("goal", "below"), ("goal", "right"), ("hole", "left"))

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        success_rate: float = 1.0 / 3.0,
        reward_schedule: tuple[float, float, float] = (1.0, 0.0, 0.0),
        progress_reward: float = 0.0,
        timeout_reward: float = 0.0,
        max_steps: int = 100,
        cell_size: int = 28,
        tile_style: str = "sprites",
        state_view: str = "layout",
        render_mode: str | None = "rgb_array",
    ):
        if state_view not in STATE_VIEWS:
            raise ValueError(f"state_view must be one of {STATE_VIEWS}, got {state_view!r}")
        self.size, self.p = size, p
        self.state_view = state_view
        self.lake_options = dict(
            is_slippery=is_slippery, success_rate=success_rate, reward_schedule=reward_schedule
        )
        self.instruction = INSTRUCTION + (SLIPPERY_NOTE if is_slippery else "")
        self.max_steps = max_steps
        self.progress_reward = progress_reward
        self.timeout_reward = timeout_reward
        self.render_mode = render_mode
        self.renderer = TileRenderer(TILE_NAMES, cell_size, tile_style)
        self.image_legend = IMAGE_LEGENDS[tile_style]
        self.action_space = spaces.Discrete(4)
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (size * cell_size, size * cell_size, 3), np.uint8),
                "text": spaces.Text(max_length=size * (size + 1), charset=GRID_CHARSET),
            }
        )
        self.lake: FrozenLakeEnv | None = None
        self.desc: list[str] = []
        self.layout_key = ""
        self.optimal_steps: int | None = None
        self.num_steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options: {"dynamics_seed": int} seeds the slips; {"map": list[str]} plays a given map;
        {"random_start": q} starts, with probability q, on a cell drawn uniformly from those that can
        reach the goal (the start cell included): exploring starts for training. Both draws come from
        the reset seed, so the members of a group share the start as they share the map."""
        super().reset(seed=seed)
        options = options or {}
        level_seed, dynamics_seed = (int(x) for x in self.np_random.integers(0, 2**31, size=2))
        start_draw, start_pick = self.np_random.random(), self.np_random.random()
        desc = (
            list(options["map"]) if "map" in options else generate_random_map(self.size, self.p, level_seed)
        )
        letters = "".join(desc)
        if len(desc) != self.size or any(len(row) != self.size for row in desc):
            raise ValueError(f"map must be {self.size} rows of {self.size} letters (env size), got {desc}")
        if set(letters) - set(LETTER_CODES) or letters.count("S") != 1 or "G" not in letters:
            raise ValueError(f"map needs letters S, F, H, G only, one S and a G, got {desc}")
        if desc != self.desc:
            self.lake = FrozenLakeEnv(desc=desc, **self.lake_options)
            self.desc = desc
            self.layout_key = "\n".join(desc)
            self._distances = goal_distances(desc)
            self._static_codes = np.array([[LETTER_CODES[ch] for ch in row] for row in desc])
            self._goals = [(r, c) for r, line in enumerate(desc) for c, ch in enumerate(line) if ch == "G"]
        self.lake.reset(seed=int(options.get("dynamics_seed", dynamics_seed)))
        if start_draw < float(options.get("random_start", 0.0)):
            cells = sorted(cell for cell, distance in self._distances.items() if distance > 0)
            if cells:  # a given map may cut the goal off from every cell
                row, col = cells[int(start_pick * len(cells))]
                self.lake.s = row * self.size + col
        self.optimal_steps = self._distances.get(self.player)
        self.num_steps = 0
        return self._observation(), self._info(action_is_effective=False)

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, 4), got {action!r}")
        before = self.lake.s
        distance_before = self.goal_distance
        _, reward, terminated, _, _ = self.lake.step(GYM_ACTIONS[int(action)])
        reward += self.progress_reward * (distance_before - self.goal_distance)
        self.num_steps += 1
        truncated = not terminated and self.num_steps >= self.max_steps
        if truncated:
            reward += self.timeout_reward
        return self._observation(), float(reward), terminated, truncated, self._info(self.lake.s != before)

    @property
    def player(self) -> tuple[int, int]:
        return divmod(int(self.lake.s), self.size)

    @property
    def goal_distance(self) -> int:
        """Manhattan distance from the player to the nearest goal cell (holes ignored)."""
        row, col = self.player
        return min(abs(row - r) + abs(col - c) for r, c in self._goals)

    def render(self) -> np.ndarray:
        codes = self._static_codes.copy()
        row, col = self.player
        codes[row, col] = PLAYER_CODES[self.desc[row][col]]
        return self.renderer.render(codes)

    def text_grid(self) -> str:
        row, col = self.player
        rows = list(self.desc)
        rows[row] = rows[row][:col] + "P" + rows[row][col + 1 :]
        return "\n".join(rows)

    def state_features(self) -> np.ndarray:
        """The true state as one-hots for a privileged critic (the policy never sees it), by `state_view`:
        "layout": each cell's tile (ice or start, hole, goal) row-major, then the player's cell; float32
        (4 n^2,). "egocentric": the map seen from the player, a (2n - 1) x (2n - 1) window centred on the
        player's cell (so it holds the whole map from any cell), channels hole, goal, off the map per
        window cell row-major (ice: all zero); float32 (3 (2n - 1)^2,). The same information; the
        egocentric view gives a hole beside the player the same inputs wherever the player stands, so a
        critic's lessons carry over between maps."""
        n = self.size
        if self.state_view == "layout":
            tiles = np.eye(3, dtype=np.float32)[[FEATURE_TILES[letter] for letter in "".join(self.desc)]]
            player = np.eye(n * n, dtype=np.float32)[self.player[0] * n + self.player[1]]
            return np.concatenate([tiles.ravel(), player])
        row, col = self.player
        window = np.zeros((2 * n - 1, 2 * n - 1, 3), dtype=np.float32)
        window[..., 2] = 1.0  # off the map, until a map cell is written
        codes = self._static_codes  # (n, n) LETTER_CODES of the map, built once per map at reset
        top, left = n - 1 - row, n - 1 - col  # where the map's cell (0, 0) lands in the window
        on_map = window[top : top + n, left : left + n]  # a view: writes land in the window
        on_map[..., 0], on_map[..., 1] = codes == LETTER_CODES["H"], codes == LETTER_CODES["G"]
        on_map[..., 2] = 0.0
        return window.ravel()

    def describe_state(self) -> list[Fact]:
        """The goal's relations to the player, then the sides of adjacent holes (see envs_visual.facts)."""
        cells = [(r, c) for r, line in enumerate(self.desc) for c, ch in enumerate(line)]
        goal = [cell for cell in cells if self.desc[cell[0]][cell[1]] == "G"]
        holes = [cell for cell in cells if self.desc[cell[0]][cell[1]] == "H"]
        return relative_facts("goal", goal, self.player) + adjacent_facts("hole", holes, self.player)

    def optimal_actions(self, max_actions: int) -> list[int]:
        """Teacher: the first `max_actions` moves of a shortest path from the player to the goal on the
        non-slippery map (ties: first action id); [] at the goal, in a hole or when the goal is cut off."""
        return shortest_path_actions(self.desc, self.player, max_actions)

    def optimal_plan(self, horizon: int) -> SlipperyPlan:
        """Value iteration on the wrapped FrozenLakeEnv's true transition model (slips included):
        the best success probability and policy for up to `horizon` steps; `plan.success[horizon, s0]`
        is the optimal policy's success from the start cell s0 within the episode's action budget."""
        return value_iteration(self.desc, self.lake.P, horizon)

    def planned_action(self) -> int | None:
        """Teacher (planner): on slippery ice, the move of the optimal policy for the whole step budget
        (`optimal_plan(max_steps)`) from the player's cell, the same whatever the steps left (the image does
        not show them, and with few left the finite-horizon policy's ties are arbitrary); None when moves
        are deterministic (the shortest path is then optimal)."""
        if not self.is_slippery:
            return None
        row, col = self.player
        return self.optimal_plan(self.max_steps).action(row * self.size + col, self.max_steps)

    def optimal_success(self, horizon: int) -> float:
        """The optimal policy's success probability from the episode's start cell within `horizon` steps."""
        return float(self.optimal_plan(horizon).success[horizon, self.start_state])

    @property
    def is_slippery(self) -> bool:
        """True when a move may slip sideways (then `optimal_plan`, not the shortest path, is optimal)."""
        return bool(self.lake_options["is_slippery"])

    @property
    def start_state(self) -> int:
        """Flat index (row * size + col) of the start cell."""
        return "".join(self.desc).index("S")

    def _observation(self) -> dict[str, Any]:
        return {"image": self.render(), "text": self.text_grid()}

    def _info(self, action_is_effective: bool) -> dict[str, Any]:
        row, col = self.player
        return {
            "success": self.desc[row][col] == "G",
            "optimal_steps": self.optimal_steps,
            "action_is_effective": bool(action_is_effective),
        }
