"""Sokoban: generation, solver, push rules, XSB and Boxoban files, rendering."""

import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs_visual  # noqa: F401  (registers the envs)
from envs_visual.sokoban import SokobanEnv, generate_level, load_boxoban, parse_xsb, solve, to_xsb
from envs_visual.sokoban.env import TILE_NAMES

REPO_ROOT = Path(__file__).resolve().parents[1]
BOXOBAN = REPO_ROOT.parent / "shared" / "data" / "boxoban"
UP, DOWN, LEFT, RIGHT = range(4)


def make(**kwargs) -> SokobanEnv:
    return gymnasium.make("envs_visual/Sokoban-v0", **kwargs).unwrapped


def test_check_env_passes():
    check_env(gymnasium.make("envs_visual/Sokoban-v0").unwrapped, skip_render_check=False)


def test_defaults_match_the_issue():
    env = make()
    obs, info = env.reset(seed=0)
    assert obs["image"].shape == (168, 168, 3) and obs["image"].dtype == np.uint8  # 6x6 cells of 28 px
    assert env.action_names == ("Up", "Down", "Left", "Right")
    assert set(info) >= {"success", "boxes_on_target", "action_is_effective", "optimal_steps"}
    assert obs["text"] == to_xsb(parse_xsb(obs["text"])) == env.layout_key


LEVEL_SCRIPT = """
import gymnasium, envs_visual
env = gymnasium.make("envs_visual/Sokoban-v0", dim_room=(8, 8), num_boxes=2)
for seed in (3, 1234567):
    print(env.reset(seed=seed)[0]["text"])
"""


def test_same_seed_same_level_in_a_fresh_process():
    fresh = subprocess.run([sys.executable, "-c", LEVEL_SCRIPT], capture_output=True, text=True, check=True)
    env = make(dim_room=(8, 8), num_boxes=2)
    here = "".join(env.reset(seed=seed)[0]["text"] + "\n" for seed in (3, 1234567))
    assert fresh.stdout == here


def test_different_seeds_give_different_levels():
    env = make()
    layouts = {env.reset(seed=seed)[0]["text"] for seed in range(50)}
    assert len(layouts) >= 45


@pytest.mark.parametrize(("dim_room", "num_boxes", "count"), [((6, 6), 1, 400), ((8, 8), 2, 100)])
def test_generated_levels_are_solved_optimally_and_replay_to_success(dim_room, num_boxes, count):
    env = make(dim_room=dim_room, num_boxes=num_boxes, max_steps=500)
    for seed in range(count):
        obs, info = env.reset(seed=seed)
        solution = solve(obs["text"])
        assert solution is not None and len(solution) == info["optimal_steps"] >= 1, obs["text"]
        for action in solution:
            obs, _, terminated, truncated, info = env.step(action)
        assert terminated and not truncated and info["success"], obs["text"]


def test_curriculum_keeps_optimal_length_in_range():
    env = make(min_optimal_steps=3, max_optimal_steps=5)
    lengths = [env.reset(seed=seed)[1]["optimal_steps"] for seed in range(100)]
    assert min(lengths) >= 3 and max(lengths) <= 5 and len(set(lengths)) == 3


def test_generator_is_a_function_of_the_rng_state():
    first, steps_first = generate_level(np.random.default_rng(5), (7, 7), 2)
    second, steps_second = generate_level(np.random.default_rng(5), (7, 7), 2)
    assert to_xsb(first) == to_xsb(second) and steps_first == steps_second


def play(xsb: str, actions: list[int]):
    env = make(dim_room=parse_xsb(xsb).shape)
    env.reset(seed=0, options={"level": xsb})
    rewards, infos = [], []
    for action in actions:
        obs, reward, terminated, _, info = env.step(action)
        rewards.append(round(reward, 6))
        infos.append(info)
    return obs["text"], rewards, infos, terminated


def test_push_onto_target_solves_with_rewards():
    text, rewards, infos, terminated = play("#####\n#@$.#\n#####", [RIGHT])
    assert text == "#####\n# @*#\n#####"
    assert rewards == [-0.1 + 1.0 + 10.0] and terminated and infos[0]["success"]


def test_box_against_wall_does_not_move():
    text, rewards, infos, _ = play("######\n#. @$#\n######", [RIGHT])
    assert text == "######\n#. @$#\n######" and rewards == [-0.1]
    assert not infos[0]["action_is_effective"]


def test_box_against_box_does_not_move():
    text, _, infos, _ = play("#######\n#@$$..#\n#######", [RIGHT])
    assert text == "#######\n#@$$..#\n#######" and not infos[0]["action_is_effective"]


def test_push_off_target_costs_and_walls_block_pushes():
    text, rewards, infos, _ = play("######\n#@*  #\n######", [RIGHT, LEFT, LEFT])
    assert rewards == [-1.1, -0.1, -0.1]
    assert text == "######\n#@.$ #\n######"
    assert [info["action_is_effective"] for info in infos] == [True, True, False]
    assert [info["boxes_on_target"] for info in infos] == [0, 0, 0]


def test_walls_block_and_player_on_target_renders_as_plus():
    text, _, infos, _ = play("#####\n#@. #\n#$  #\n#####", [UP, RIGHT])
    assert not infos[0]["action_is_effective"] and infos[1]["action_is_effective"]
    assert text == "#####\n# + #\n#$  #\n#####"


def test_state_features_are_wall_target_box_and_player_planes():
    env = make(dim_room=(3, 4))
    env.reset(seed=0, options={"level": "####\n#@*#\n####"})
    walls = [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]
    on_the_box = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]  # the box sits on the target at (1, 2)
    player = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert env.state_features().tolist() == walls + on_the_box + on_the_box + player


def test_xsb_round_trip_and_bad_levels_raise():
    xsb = "#####\n#+$ #\n# * #\n#   #\n#####"
    level = parse_xsb(xsb)
    assert to_xsb(level) == xsb and level.player == (1, 1) and level.boxes.sum() == 2
    for bad in ["", "#####\n#  $.#\n#####", "##\n#@x.$#", "#@@$.#"]:
        with pytest.raises(ValueError):
            parse_xsb(bad)
    with pytest.raises(ValueError):
        make().reset(options={"level": "#####\n#@$.#\n#####"})  # 3x5 level in a 6x6 env


def test_solver_finds_shortest_and_detects_unsolvable():
    assert solve("#####\n#@$.#\n#####") == [RIGHT]
    assert solve("######\n#@ $.#\n######") == [RIGHT, RIGHT]
    assert solve("#####\n#.  #\n#  $#\n#@  #\n#####") is None  # box in a corner
    # Cheapest by hand: walk 3 to the right of the box, push Left, walk 2 below it, push Up = 7 moves.
    level = "#######\n#.   @#\n# $   #\n#     #\n#######"
    solution = solve(level)
    assert len(solution) == 7 and play(level, solution)[3]


@pytest.mark.skipif(not BOXOBAN.exists(), reason=f"Boxoban samples not found at {BOXOBAN}")
def test_boxoban_files_load_render_and_step():
    files = sorted(BOXOBAN.glob("*/**/*.txt"))  # hard/000.txt, medium/valid/000.txt, unfiltered/test/000.txt
    assert len(files) >= 3
    env = make(dim_room=(10, 10), solver_max_states=20_000)
    for path in files:
        levels = load_boxoban(path)
        headers = sum(line.startswith(";") for line in path.read_text().splitlines())
        assert len(levels) == headers > 10 and all(len(level.splitlines()) == 10 for level in levels)
        obs, info = env.reset(options={"level": levels[0]})
        level = parse_xsb(levels[0])
        assert obs["text"] == levels[0] and obs["image"].shape == (280, 280, 3)
        assert level.boxes.sum() == 4 and info["boxes_on_target"] == (level.boxes & level.targets).sum()
        for action in range(4):
            env.step(action)


def test_tiles_are_distinct_at_the_default_cell_size():
    tiles = make().renderer.tile_rows.reshape(len(TILE_NAMES), 28, 28, 3).astype(float)
    for i in range(len(TILE_NAMES)):
        for j in range(i):
            assert np.abs(tiles[i] - tiles[j]).mean() > 8, (TILE_NAMES[i], TILE_NAMES[j])


def test_image_cells_show_the_state():
    env = make(dim_room=(3, 5), cell_size=10)
    env.reset(options={"level": "#####\n#@$.#\n#####"})
    image, tiles = env.render(), env.renderer.tile_rows.reshape(len(TILE_NAMES), 10, 10, 3)
    for (row, col), name in [((0, 0), "sokoban_wall"), ((1, 1), "sokoban_player"), ((1, 2), "sokoban_box")]:
        assert np.array_equal(
            image[row * 10 : row * 10 + 10, col * 10 : col * 10 + 10], tiles[TILE_NAMES.index(name)]
        )


def test_describe_state_relative_to_player():
    env = make(dim_room=(4, 5))
    env.reset(options={"level": "#####\n#$ .#\n#  @#\n#####"})
    assert env.describe_state() == [
        ("box", "above"),
        ("box", "left"),
        ("target", "above"),
        ("target", "same column"),
    ]


def test_flat_tiles_are_distinct_solid_colours():
    env = make(dim_room=(3, 5), cell_size=10, tile_style="flat")
    check_env(env, skip_render_check=False)
    tiles = env.renderer.tile_rows.reshape(len(TILE_NAMES), 10, 10, 3).astype(float)
    assert all((tile == tile[0, 0]).all() for tile in tiles)  # one colour per tile
    for i in range(len(TILE_NAMES)):
        for j in range(i):
            assert np.abs(tiles[i] - tiles[j]).mean() > 30, (TILE_NAMES[i], TILE_NAMES[j])
    assert "blue cell is you" in env.image_legend


def test_random_start_lies_on_a_shortest_solution_and_keeps_the_level():
    env = make(dim_room=(6, 6), num_boxes=1, min_optimal_steps=2, max_optimal_steps=5)
    moved = 0
    for seed in range(30):
        _, plain = env.reset(seed=seed)
        layout, solution = env.layout_key, solve(env.layout_key)
        _, info = env.reset(seed=seed, options={"random_start": 1.0})
        assert env.layout_key == layout  # the same level: the start draws come after it
        remaining = solve(to_xsb(env.level))
        assert info["optimal_steps"] == len(remaining) and not info["success"] and env.num_steps == 0
        assert plain["optimal_steps"] - info["optimal_steps"] in range(len(solution))
        moved += info["optimal_steps"] < plain["optimal_steps"]
        env.reset(seed=seed, options={"random_start": 1.0})  # another member of the group
        assert solve(to_xsb(env.level)) == remaining
    assert 10 < moved < 30  # most starts move along the path; the level's own start stays a draw
