"""The env contract: what the trainer reads of an env (docs/envs.md has the long form).

Required (`GridEnv`): a gymnasium.Env whose observations are {"image": uint8 (H, W, 3), "text": str},
with `action_names` (one per discrete action id), `instruction`, `image_legend`, `text_legend`,
`render()` (the current image) and `text_grid()` (the current text), and `reset(seed=s)` that fixes the
level from `s` alone, in any process. `reset` accepts `options={"dynamics_seed": int}` (the seed of any
randomness of the steps; deterministic envs ignore it).

Optional, each turning on something (OPTIONAL_FEATURES names them):
  facts            describe_state() -> [(object, relation)], example_facts   grounding / world-model rewards
  state_features   state_features() -> float32 (D,)                          privileged state critic (MPO)
  layout_key       str after reset, equal for equal levels                   held-out layout split
  random_start     supports_random_start = True, reset option random_start   rollout.random_start
  solver           optimal_actions(max_actions) -> [action ids]              warm_start.teacher solver
  planner          planned_action() -> action id or None                     warm_start.teacher planner
  optimal_success  optimal_success(horizon) -> float                         the optimum's reference line
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium
import numpy as np

from envs_visual.facts import OBJECTS, RELATIONS


class GridEnv(Protocol):
    """The required part of the contract (module docstring, REQUIRED); `env.unwrapped` of gymnasium.make."""

    action_names: tuple[str, ...]
    instruction: str
    image_legend: str
    text_legend: str

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None): ...

    def step(self, action: int): ...

    def render(self) -> np.ndarray: ...

    def text_grid(self) -> str: ...


REQUIRED = ("action_names", "instruction", "image_legend", "text_legend", "render", "text_grid")
# feature -> the attribute whose presence turns it on
OPTIONAL_FEATURES = {
    "facts": "describe_state",
    "state_features": "state_features",
    "layout_key": "layout_key",
    "random_start": "supports_random_start",
    "solver": "optimal_actions",
    "planner": "planned_action",
    "optimal_success": "optimal_success",
}


class ContractError(ValueError):
    """An env breaks the contract; the message names the env and what is wrong."""


def features_of(game: GridEnv) -> set[str]:
    """The optional features (OPTIONAL_FEATURES) an unwrapped env offers."""
    offered = {name for name, attribute in OPTIONAL_FEATURES.items() if hasattr(game, attribute)}
    if not getattr(game, "supports_random_start", False):
        offered.discard("random_start")
    return offered


def check_contract(env: gymnasium.Env, seed: int = 0) -> set[str]:
    """Check an env against the contract on the level of `seed` (two resets and one step of action 0);
    returns its optional features. Raises ContractError."""
    game = env.unwrapped
    name = type(game).__name__

    def require(condition: bool, what: str) -> None:
        if not condition:
            raise ContractError(f"{name}: {what}")

    missing = [attribute for attribute in REQUIRED if not hasattr(game, attribute)]
    require(not missing, f"needs {', '.join(missing)}")
    require(isinstance(env.action_space, gymnasium.spaces.Discrete), "the action space must be Discrete")
    require(len(game.action_names) == env.action_space.n, "one action name per action id")
    require(len(set(n.lower() for n in game.action_names)) == len(game.action_names), "action names clash")
    observation, info = env.reset(seed=seed, options={"dynamics_seed": seed})
    require(set(observation) == {"image", "text"}, "observations are {'image', 'text'}")
    image = observation["image"]
    require(
        image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3, "the image is uint8 (H, W, 3)"
    )
    require(np.array_equal(game.render(), image), "render() is the observed image")
    require(game.text_grid() == observation["text"], "text_grid() is the observed text")
    features = features_of(game)
    if "layout_key" in features:
        layout = game.layout_key
        again, _ = env.reset(seed=seed)
        require(game.layout_key == layout, "reset(seed) gives the same layout_key")
        require(np.array_equal(again["image"], image), "reset(seed) gives the same image")
    if "facts" in features:
        facts = game.describe_state() + list(getattr(game, "example_facts", []))
        unknown = [fact for fact in facts if fact[0] not in OBJECTS or fact[1] not in RELATIONS]
        require(not unknown, f"facts outside envs_visual.facts' vocabulary: {unknown}")
    if "state_features" in features:
        vector = game.state_features()
        require(vector.dtype == np.float32 and vector.ndim == 1, "state_features() is float32 (D,)")
    env.step(0)
    return features
