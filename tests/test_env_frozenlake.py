"""FrozenLake: gymnasium's dynamics on seeded maps, seeded slips, observations."""

import gymnasium
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from gymnasium.utils.env_checker import check_env

import envs_visual  # noqa: F401  (registers the envs)
from envs_visual.frozenlake import VisualFrozenLakeEnv, shortest_path_length
from envs_visual.frozenlake.env import GYM_ACTIONS


def make(**kwargs) -> VisualFrozenLakeEnv:
    return gymnasium.make("envs_visual/FrozenLake-v0", **kwargs).unwrapped


@pytest.mark.parametrize("is_slippery", [False, True])
def test_check_env_passes(is_slippery):
    check_env(make(is_slippery=is_slippery), skip_render_check=False)


@pytest.mark.parametrize("is_slippery", [False, True])
def test_transitions_equal_gymnasium_frozenlake(is_slippery):
    rng = np.random.default_rng(0)
    env = make(size=5, is_slippery=is_slippery)
    for episode in range(20):
        env.reset(seed=episode, options={"dynamics_seed": 100 + episode})
        reference = FrozenLakeEnv(desc=env.desc, is_slippery=is_slippery)
        reference.reset(seed=100 + episode)
        for action in rng.integers(0, 4, 30):
            _, reward, terminated, _, info = env.step(int(action))
            state, ref_reward, ref_terminated, _, _ = reference.step(GYM_ACTIONS[action])
            assert (env.lake.s, reward, terminated) == (state, ref_reward, ref_terminated)
            assert info["success"] == (env.desc[state // 5][state % 5] == "G")
            if terminated:
                break


def trajectory(env, seed, dynamics_seed=None, steps=40):
    options = {} if dynamics_seed is None else {"dynamics_seed": dynamics_seed}
    env.reset(seed=seed, options=options)
    states = []
    for _ in range(steps):
        *_, terminated, _, _ = env.step(3)  # Right: slips go Up/Down
        states.append(env.lake.s)
        if terminated:
            break
    return env.layout_key, states


def test_seeded_maps_and_slips():
    first, second = make(size=6, p=0.9, is_slippery=True), make(size=6, p=0.9, is_slippery=True)
    assert trajectory(first, 1) == trajectory(second, 1)
    assert len({make(size=6).reset(seed=seed)[0]["text"] for seed in range(20)}) >= 18
    slips = {tuple(trajectory(first, 1, dynamics_seed)[1]) for dynamics_seed in range(20)}
    assert len(slips) > 1 and len({trajectory(first, 1, d)[0] for d in range(5)}) == 1


def test_optimal_steps_is_the_shortest_path():
    desc = ["SFH", "HFF", "FFG"]
    env = make(size=3)
    _, info = env.reset(options={"map": desc})
    assert info["optimal_steps"] == shortest_path_length(desc) == 4
    assert shortest_path_length(["SH", "HG"]) is None
    for bad in (["SFH", "HFF"], ["SFH", "HXF", "FFG"], ["SFH", "HSF", "FFG"], ["SFH", "HFF", "FFF"]):
        with pytest.raises(ValueError):
            env.reset(options={"map": bad})


def test_observation_text_image_and_facts():
    env = make(size=3, cell_size=10)
    obs, _ = env.reset(options={"map": ["SFH", "HFF", "FFG"]})
    assert obs["text"] == "PFH\nHFF\nFFG" and obs["image"].shape == (30, 30, 3)
    assert env.describe_state() == [("goal", "below"), ("goal", "right"), ("hole", "below")]
    obs, reward, terminated, _, info = env.step(1)  # Down into the hole
    assert terminated and reward == 0 and not info["success"] and obs["text"] == "SFH\nPFF\nFFG"
    tiles = env.renderer.tile_rows.reshape(-1, 10, 10, 3)
    assert np.array_equal(obs["image"][10:20, 0:10], tiles[5])  # player in hole
    env.reset(options={"map": ["SFH", "HFF", "FFG"]})
    for action in (3, 1, 1, 3):  # Right, Down, Down, Right
        obs, reward, terminated, _, info = env.step(action)
    assert terminated and reward == 1 and info["success"] and obs["text"] == "SFH\nHFF\nFFP"


def test_state_features_are_tile_planes_then_the_player():
    env = make(size=2)
    env.reset(options={"map": ["SH", "FG"]})
    env.step(1)  # Down
    ice, hole, goal = [1, 0, 0], [0, 1, 0], [0, 0, 1]
    expected = [*ice, *hole, *ice, *goal] + [0, 0, 1, 0]  # cells S H / F G, then the player at (1, 0)
    assert env.state_features().tolist() == expected and env.state_features().dtype == np.float32


def test_egocentric_state_features_show_the_map_from_the_player():
    env = make(size=2, state_view="egocentric")
    env.reset(options={"map": ["SH", "FG"]})
    env.step(1)  # Down: the player stands on (1, 0), the centre of a 3 x 3 window
    off, ice, hole, goal = [0, 0, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0]
    expected = [*off, *ice, *hole] + [*off, *ice, *goal] + [*off, *off, *off]
    assert env.state_features().tolist() == expected and env.state_features().dtype == np.float32
    env.step(3)  # Right, onto the goal: the map moves one cell left in the window
    assert env.state_features().tolist() == [*ice, *hole, *off] + [*ice, *goal, *off] + [*off, *off, *off]
    with pytest.raises(ValueError, match="state_view must be one of"):
        make(state_view="top-down")


def test_flat_tile_style_paints_each_cell_one_colour_and_says_so_in_the_legend():
    from envs_visual.render import FLAT_COLOURS

    env = make(size=3, cell_size=10, tile_style="flat")
    check_env(env, skip_render_check=False)
    obs, _ = env.reset(options={"map": ["SFH", "HFF", "FFG"]})
    for (row, col), name in [
        ((0, 0), "frozenlake_player"),
        ((0, 2), "frozenlake_hole"),
        ((2, 2), "frozenlake_goal"),
        ((1, 1), "frozenlake_ice"),
    ]:
        cell = obs["image"][row * 10 : row * 10 + 10, col * 10 : col * 10 + 10].reshape(-1, 3)
        assert (cell == FLAT_COLOURS[name]).all(), name
    assert "red cell is you" in env.image_legend and "orange figure" in make().image_legend
    with pytest.raises(ValueError, match="tile style"):
        make(tile_style="pastel")


def test_progress_reward_pays_manhattan_progress_and_telescopes():
    """c * (d(s) - d(s')), d = Manhattan distance to G; hand-computed on a fixed map with hole -1."""
    env = VisualFrozenLakeEnv(progress_reward=0.5, reward_schedule=(10.0, -1.0, 0.0), max_steps=20)
    env.reset(options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    up, down, left, right = range(4)
    rewards = []
    for action in (right, left, up, down, down, right, right, down, right):
        _, reward, terminated, _, _ = env.step(action)
        rewards.append(reward)
    # right +0.5, left -0.5, up into the edge 0, down +0.5, down +0.5, right (2,1) +0.5, right (2,2) +0.5,
    # down (3,2) +0.5, right onto G: +0.5 + 10
    assert rewards == [0.5, -0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 10.5]
    assert terminated
    # the shaping sums to c * d(start): walking back and forth earns nothing
    assert sum(rewards) - 10.0 == pytest.approx(0.5 * 6)
    env.reset(options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    env.step(down)
    _, reward, terminated, _, _ = env.step(right)  # into the hole at (1, 1): progress +0.5, hole -1
    assert (reward, terminated) == (-0.5, True)


def test_timeout_reward_is_paid_on_the_truncating_step_only():
    env = VisualFrozenLakeEnv(reward_schedule=(10.0, -1.0, 0.0), timeout_reward=-1.0, max_steps=3)
    env.reset(options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    up = 0
    steps = [env.step(up)[1:4] for _ in range(3)]  # bump into the top edge three times
    assert steps == [(0.0, False, False), (0.0, False, False), (-1.0, False, True)]


def test_random_start_draws_reachable_cells_shared_by_a_seed():
    env = make(size=4)
    starts = {}
    for seed in range(60):
        env.reset(seed=seed)
        start_cell = env.player
        _, info = env.reset(seed=seed, options={"random_start": 1.0, "dynamics_seed": 7})
        reachable = {cell for cell, distance in env._distances.items() if distance > 0}
        assert env.player in reachable and info["optimal_steps"] == env._distances[env.player]
        starts[seed] = (start_cell, env.player)
        env.reset(seed=seed, options={"random_start": 1.0, "dynamics_seed": 8})  # another group member
        assert env.player == starts[seed][1]
    moved = sum(start != player for start, player in starts.values())
    assert 30 < moved < 60  # most starts move; the start cell itself stays a possible draw
    assert all(make(size=4).reset(seed=s)[0]["text"].startswith("P") for s in range(5))  # default: S
    cut_off = make(size=2)
    cut_off.reset(options={"map": ["SH", "HG"], "random_start": 1.0})  # no cell reaches the goal: keep S
    assert cut_off.player == (0, 0)
