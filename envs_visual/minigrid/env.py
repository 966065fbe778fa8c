"""MiniGrid through the env contract: Farama's `minigrid` dynamics and levels, our observations.

The wrapped task (`task`, a MiniGrid gymnasium id) keeps its own grid generator, step rules, rewards and
`max_steps` truncation; this wrapper only picks the task's actions, renders the grid inside MiniGrid's outer
wall (one cell per `cell_size` pixels, the agent as MiniGrid's red triangle pointing where it faces) and
writes the same state as a text grid, facts and one-hot planes. The outer wall, the same ring of walls in
every MiniGrid task, is left out of the image and the text: it would be most of a small grid's cells and
tell nothing (a tiny VLM pretrained on the whole 6x6 LavaGap grid never learned to find the agent,
docs/research/probe-log.md round 23). Nothing of MiniGrid's dynamics is copied: the solver searches by
stepping copies of the wrapped env.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium
import minigrid  # noqa: F401  (registers the MiniGrid-* ids)
import numpy as np
from gymnasium import spaces

from envs_visual.facts import Fact, adjacent_facts, relative_facts
from envs_visual.paths import goal_distances

# One character per cell of the text grid; the agent is drawn by the way it faces.
CELL_CHARS = {"empty": ".", "wall": "W", "lava": "L", "goal": "G", "key": "K", "ball": "B", "box": "X"}
DOOR_CHARS = {"open": "O", "closed": "C", "locked": "D"}
AGENT_CHARS = ">v<^"  # MiniGrid's agent_dir 0..3: facing right, down, left, up
GRID_CHARSET = "".join(CELL_CHARS.values()) + "".join(DOOR_CHARS.values()) + AGENT_CHARS + "\n"
TEXT_LEGEND = (
    "In the grid: '>', 'v', '<', '^' you, pointing where you face; 'W' wall, '.' floor, 'L' lava, "
    "'G' goal, 'K' key, 'D' locked door, 'C' closed door, 'O' open door. Row 1 is the top row."
)
IMAGE_LEGEND = (
    "In the image: the red triangle is you, pointing where you face; grey cells are walls, black cells "
    "floor, orange cells lava, the green cell the goal, a yellow key-shaped object the key and a yellow "
    "square with a frame the door."
)
ACTION_RULES = (
    "Left and Right turn you a quarter turn in place; Forward steps one cell the way you face (a wall "
    "or a closed door stops you)."
)
# state_features(): one plane per kind of cell, then the agent's cell per direction, then what it carries.
FEATURE_CELLS = ("wall", "lava", "goal", "key", "ball", "box", "door open", "door closed", "door locked")
CARRIED_OBJECTS = ("key", "ball", "box")


@dataclass(frozen=True)
class Task:
    """What the wrapper needs to know of one MiniGrid task: its actions (MiniGrid's own action names and
    ids), the instruction, and the objects its facts describe."""

    action_names: tuple[str, ...]
    instruction: str
    example_facts: tuple[Fact, ...]


MINIGRID_ACTIONS = {"Left": 0, "Right": 1, "Forward": 2, "Pickup": 3, "Drop": 4, "Toggle": 5}
LAVA_GAP = Task(
    ("Left", "Right", "Forward"),
    "You are playing MiniGrid LavaGap. Reach the green goal square through the gap in the wall of lava; "
    f"stepping into lava ends the game. {ACTION_RULES}",
    (("goal", "below"), ("goal", "right"), ("lava", "right")),
)
LAVA_CROSSING = dataclasses.replace(
    LAVA_GAP,
    instruction="You are playing MiniGrid LavaCrossing. Reach the green goal square through the gaps in the "
    f"walls of lava; stepping into lava ends the game. {ACTION_RULES}",
)
# MiniGrid registers its lava crossings at 9 x 9 and up; this one is its own generator (CrossingEnv) at the
# 7 x 7 of LavaGapS7, with two walls of lava to cross: 82 layouts instead of LavaGap's 8 or 15.
if "MiniGrid-LavaCrossingS7N2-v0" not in gymnasium.registry:
    gymnasium.register(
        "MiniGrid-LavaCrossingS7N2-v0", "minigrid.envs:CrossingEnv", kwargs={"size": 7, "num_crossings": 2}
    )
TASKS = {
    "MiniGrid-LavaGapS6-v0": LAVA_GAP,  # 8 layouts: the lava column x in {2, 3}, its gap y in 1..4
    "MiniGrid-LavaGapS7-v0": LAVA_GAP,  # 15 layouts: x in {2, 3, 4}, y in 1..5
    "MiniGrid-LavaCrossingS7N2-v0": LAVA_CROSSING,  # 82 layouts: two of the 4 walls at x or y in {2, 4}
    "MiniGrid-DoorKey-5x5-v0": Task(
        ("Left", "Right", "Forward", "Pickup", "Toggle"),
        "You are playing MiniGrid DoorKey. Pick up the key, unlock the door with it and reach the green goal "
        f"square. {ACTION_RULES} Pickup takes the object in front of you; Toggle opens the door in front "
        "of you (a locked door needs the key).",
        (("key", "below"), ("door", "right"), ("goal", "right")),
    ),
}


class MiniGridEnv(gymnasium.Env):
    """A MiniGrid task with the task's actions and {"image", "text"} observations of the whole grid.

    The image and the text show the cells inside the outer wall: (height - 2) x (width - 2) of them.
    Rewards, termination (goal or lava) and truncation (after `max_steps` steps; None keeps the task's
    own limit) are MiniGrid's: the goal pays 1 - 0.9 * steps / max_steps, times `reward_scale`.
    info: success (the agent stands on the goal), action_is_effective (the agent or the grid changed).
    Levels: `reset(seed)` passes the seed to MiniGrid's generator, so the seed alone fixes the level;
    `start="random"` also draws the start (cell and direction) from it, the layout key still the task's.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    supports_random_start = True
    text_legend = TEXT_LEGEND
    image_legend = IMAGE_LEGEND

    def __init__(
        self,
        task: str = "MiniGrid-LavaGapS6-v0",
        max_steps: int | None = None,
        reward_scale: float = 1.0,
        cell_size: int = 28,
        render_mode: str | None = "rgb_array",
        start: str = "task",
    ):
        if task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
        if start not in ("task", "random"):
            raise ValueError(f"start must be 'task' or 'random', got {start!r}")
        spec = TASKS[task]
        self.task = task
        self.game = gymnasium.make(task, **({} if max_steps is None else {"max_steps": max_steps})).unwrapped
        self.max_steps = self.game.max_steps
        self.reward_scale = reward_scale
        self.cell_size = cell_size
        self.render_mode = render_mode
        self.start = start
        self.action_names = spec.action_names
        self.instruction = spec.instruction
        self.example_facts = spec.example_facts
        self._action_ids = [MINIGRID_ACTIONS[name] for name in spec.action_names]
        width, height = self.game.width - 2, self.game.height - 2  # inside the outer wall
        self.action_space = spaces.Discrete(len(spec.action_names))
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (height * cell_size, width * cell_size, 3), np.uint8),
                "text": spaces.Text(max_length=height * (width + 1), charset=GRID_CHARSET),
            }
        )
        self.layout_key = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options: {"random_start": q} starts, with probability q, on an empty cell and facing a direction
        drawn uniformly (exploring starts for training; the layout key is the level's own start); the
        draws come from the reset seed, so the members of a group share the start as they share the level.
        With `start="random"` every reset starts so (a level is then a layout and a start: a held-out layout
        is played from many starts, where LavaGap's own start makes it one episode).
        "dynamics_seed" is accepted and has no effect (MiniGrid's steps are deterministic)."""
        super().reset(seed=seed)
        start_draw, start_pick, direction = self.np_random.random(3)
        self.game.reset(seed=seed)
        self._check_outer_wall()
        self.layout_key = self._grid_text(margin=0)  # the whole level: LavaGapS6 holds out 1 of its 8
        random_start = 1.0 if self.start == "random" else float((options or {}).get("random_start", 0.0))
        if start_draw < random_start:
            cells = self._cells_joined_to_goal()
            self.game.agent_pos = cells[int(start_pick * len(cells))]
            self.game.agent_dir = int(direction * 4)
        return self._observation(), self._info(action_is_effective=False)

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, {self.action_space.n}), got {action!r}")
        before = self._state_key()
        _, reward, terminated, truncated, _ = self.game.step(self._action_ids[int(action)])
        effective = self._state_key() != before
        return (
            self._observation(),
            float(reward) * self.reward_scale,
            terminated,
            truncated,
            self._info(effective),
        )

    def render(self) -> np.ndarray:
        """The cells inside the outer wall, `cell_size` pixels each."""
        frame = self.game.get_frame(highlight=False, tile_size=self.cell_size, agent_pov=False)
        border = self.cell_size
        return np.ascontiguousarray(frame[border:-border, border:-border])

    def text_grid(self) -> str:
        """One character per cell inside the outer wall (CELL_CHARS, DOOR_CHARS; the agent by AGENT_CHARS),
        rows top to bottom."""
        return self._grid_text(margin=1)

    def _grid_text(self, margin: int) -> str:
        """text_grid's characters for the cells `margin` or more cells inside the level's edge."""
        width, height = self.game.width, self.game.height
        rows = [
            [self._cell_char(x, y) for x in range(margin, width - margin)]
            for y in range(margin, height - margin)
        ]
        x, y = self.agent
        rows[y - margin][x - margin] = AGENT_CHARS[self.game.agent_dir]
        return "\n".join("".join(row) for row in rows)

    def state_features(self) -> np.ndarray:
        """The true state as one-hots for a privileged critic (the policy never sees it): per cell, row-major,
        the FEATURE_CELLS planes, then the agent's cell once per direction it may face, then what it carries
        (CARRIED_OBJECTS); float32 (H W (len(FEATURE_CELLS) + 4) + len(CARRIED_OBJECTS),)."""
        height, width = self.game.height, self.game.width
        cells = np.zeros((height, width, len(FEATURE_CELLS)), np.float32)
        for y in range(height):
            for x in range(width):
                name = self._cell_name(x, y)
                if name in FEATURE_CELLS:
                    cells[y, x, FEATURE_CELLS.index(name)] = 1.0
        agent = np.zeros((height, width, 4), np.float32)
        x, y = self.agent
        agent[y, x, self.game.agent_dir] = 1.0
        carried = self.game.carrying
        carrying = np.array(
            [carried is not None and carried.type == name for name in CARRIED_OBJECTS], np.float32
        )
        return np.concatenate([np.concatenate([cells, agent], axis=2).ravel(), carrying])

    def describe_state(self) -> list[Fact]:
        """Relations to the agent of the goal, key and door (envs_visual.facts), then the sides of adjacent
        lava, in grid directions (row = y, column = x)."""
        cells = {name: [] for name in ("goal", "key", "door", "lava")}
        for y in range(self.game.height):
            for x in range(self.game.width):
                name = self._cell_name(x, y).split(" ")[0]
                if name in cells:
                    cells[name].append((y, x))
        player = self.agent[::-1]
        facts = []
        for name in ("goal", "key", "door"):
            facts += relative_facts(name, cells[name], player)
        return facts + adjacent_facts("lava", cells["lava"], player)

    def optimal_actions(self, max_actions: int) -> list[int]:
        """Teacher: the first `max_actions` actions of a shortest way to the goal from the current state,
        by breadth-first search over copies of the wrapped env stepped with MiniGrid's own rules (ties:
        first action id); [] when the episode is over or the goal cannot be reached."""
        start = copy.deepcopy(self.game)
        queue, seen = deque([(start, [])]), {self._state_key(start)}
        while queue:
            game, path = queue.popleft()
            for action, minigrid_action in enumerate(self._action_ids):
                child = copy.deepcopy(game)
                _, reward, terminated, truncated, _ = child.step(minigrid_action)
                if terminated and reward > 0:
                    return (path + [action])[:max_actions]
                key = self._state_key(child)
                if not (terminated or truncated) and key not in seen:
                    seen.add(key)
                    queue.append((child, path + [action]))
        return []

    @property
    def agent(self) -> tuple[int, int]:
        """The agent's cell as MiniGrid's (x, y): column, row."""
        x, y = self.game.agent_pos
        return int(x), int(y)

    def _cell_name(self, x: int, y: int) -> str:
        """The kind of cell (x, y): "empty", an object type, or "door open|closed|locked"."""
        obj = self.game.grid.get(x, y)
        if obj is None:
            return "empty"
        if obj.type == "door":
            state = "open" if obj.is_open else "locked" if obj.is_locked else "closed"
            return f"door {state}"
        return obj.type

    def _cell_char(self, x: int, y: int) -> str:
        name = self._cell_name(x, y)
        if name.startswith("door"):
            return DOOR_CHARS[name.split(" ")[1]]
        if name not in CELL_CHARS:
            raise ValueError(f"{self.task}: no text character for a {name!r} cell")
        return CELL_CHARS[name]

    def _cells_joined_to_goal(self) -> list[tuple[int, int]]:
        """The empty cells (x, y), row-major, joined to the goal by side-by-side cells that are neither wall
        nor lava (doors and keys pass: a key opens its door), so that a random start can win; read from
        the reset's layout key. MiniGrid's crossings connect only the task's own start to the goal: 24 of
        200 random LavaCrossingS7N2 starts were shut in by lava."""
        rows = self.layout_key.split("\n")
        joined = goal_distances(
            rows, goal=CELL_CHARS["goal"], blocked=CELL_CHARS["wall"] + CELL_CHARS["lava"]
        )
        floor = CELL_CHARS["empty"] + AGENT_CHARS  # the level's own start cell is empty too
        return [(x, y) for y, x in sorted(joined) if rows[y][x] in floor]

    def _check_outer_wall(self) -> None:
        game = self.game
        ring = [(x, y) for x in range(game.width) for y in (0, game.height - 1)]
        ring += [(x, y) for y in range(game.height) for x in (0, game.width - 1)]
        if any(self._cell_name(x, y) != "wall" for x, y in ring):
            raise ValueError(f"{self.task}: the observation leaves out the outer wall; this level has none")

    def _state_key(self, game=None) -> tuple:
        """What a step can change: the agent's cell and direction, what it carries, and the grid."""
        game = self.game if game is None else game
        carried = None if game.carrying is None else game.carrying.type
        return tuple(game.agent_pos), game.agent_dir, carried, game.grid.encode().tobytes()

    def _observation(self) -> dict[str, Any]:
        return {"image": self.render(), "text": self.text_grid()}

    def _info(self, action_is_effective: bool) -> dict[str, Any]:
        cell = self.game.grid.get(*self.agent)
        return {
            "success": cell is not None and cell.type == "goal",
            "action_is_effective": bool(action_is_effective),
        }
