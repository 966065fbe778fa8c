"""Teachers: per-state shortest-path actions (FrozenLake BFS, Sokoban solver) and value iteration on
gymnasium's slippery FrozenLake model, against values worked out by hand."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

import envs_visual  # noqa: F401
from envs_visual.frozenlake.planning import policy_success, shortest_path_actions, value_iteration
from vagen.pretrain.teachers import planner_teacher, teacher_available

UP, DOWN, LEFT, RIGHT = range(4)
FORWARD = 2  # MiniGrid LavaGap: Left, Right, Forward


def frozen_lake(desc, slippery=False):
    env = gym.make("envs_visual/FrozenLake-v0", size=len(desc), is_slippery=slippery).unwrapped
    env.reset(seed=0, options={"map": desc})
    return env


def test_frozenlake_shortest_path_teacher_one_and_two_steps():
    assert frozen_lake(["SG", "FF"]).optimal_actions(3) == [RIGHT]
    two_steps = frozen_lake(["SF", "HG"])
    assert two_steps.optimal_actions(3) == [RIGHT, DOWN]
    assert two_steps.optimal_actions(1) == [RIGHT]
    two_steps.step(RIGHT)
    assert two_steps.optimal_actions(3) == [DOWN]  # from the player's current cell
    two_steps.step(DOWN)
    assert two_steps.optimal_actions(3) == []  # on the goal
    assert frozen_lake(["SF", "FG"]).optimal_actions(2) == [DOWN, RIGHT]  # tie: the first action id
    assert shortest_path_actions(["SH", "HG"], (0, 0), 5) == []  # goal cut off


def test_value_iteration_non_slippery_counts_steps():
    env = frozen_lake(["SF", "HG"])
    plan = env.optimal_plan(horizon=3)
    assert plan.success[:, env.start_state].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert plan.action(env.start_state, steps_left=2) == RIGHT


def test_value_iteration_slippery_one_step_map():
    # From S every action reaches G with 1/3: Right directly; Up and Down slip sideways to the right.
    plan = frozen_lake(["SG", "FF"], slippery=True).optimal_plan(horizon=1)
    assert plan.success[1, 0] == pytest.approx(1 / 3)


def test_value_iteration_prefers_the_safe_longer_route_when_slippery():
    # S F G over a row of holes. "Right" (the shortest path) slips Down into a hole with 1/3; "Up" bumps
    # the wall with 1/3, slips Left (stays or back) or Right (forward) with 1/3 each, and never falls.
    # By hand, a = (0,0), b = (0,1): V1(b) = 1/3, V1(a) = 0; V2(b) = 1/3 + V1(b)/3 = 4/9, V2(a) = 1/9;
    # V3(a) = max(Up: V2(b)/3 + 2 V2(a)/3 = 2/9, Right: V2(b)/3 + V2(a)/3 = 5/27) = 2/9 by Up.
    desc = ["SFG", "HHH"]
    lake = FrozenLakeEnv(desc=desc, is_slippery=True)
    assert shortest_path_actions(desc, (0, 0), 1) == [RIGHT]
    plan = value_iteration(desc, lake.P, horizon=3)
    assert plan.success[1, :3].tolist() == pytest.approx([0.0, 1 / 3, 1.0])
    assert plan.success[2, 1] == pytest.approx(4 / 9)
    assert plan.success[3, 0] == pytest.approx(2 / 9)
    assert plan.action(0, steps_left=3) == UP
    assert plan.success[:, 3:].max() == 0.0  # holes
    assert value_iteration(desc, lake.P, horizon=200).success[200, 0] > 0.99  # Up forever never falls


def test_policy_success_of_the_safe_route_and_of_the_shortest_path():
    # The map above: always Up is the optimal policy for 3 steps (2/9); always Right, the shortest
    # path, reaches G within 3 steps with 5/27 (by hand in the test above). Holes and G absorb.
    desc = ["SFG", "HHH"]
    lake = FrozenLakeEnv(desc=desc, is_slippery=True)
    assert policy_success(desc, lake.P, np.full(6, UP), 0, horizon=3) == pytest.approx(2 / 9)
    assert policy_success(desc, lake.P, np.full(6, RIGHT), 0, horizon=3) == pytest.approx(5 / 27)
    assert policy_success(desc, lake.P, np.full(6, RIGHT), 0, horizon=1) == 0.0
    ice = FrozenLakeEnv(desc=["SG", "FF"], is_slippery=False)
    assert policy_success(["SG", "FF"], ice.P, np.full(4, RIGHT), 0, horizon=1) == 1.0


def test_value_iteration_matches_monte_carlo_of_its_policy():
    env = gym.make("envs_visual/FrozenLake-v0", size=4, is_slippery=True, max_steps=8).unwrapped
    env.reset(seed=3)
    plan = env.optimal_plan(horizon=8)
    wins = 0
    for episode in range(2000):
        env.reset(seed=3, options={"dynamics_seed": episode})
        for steps_left in range(8, 0, -1):
            _, _, terminated, truncated, info = env.step(plan.action(int(env.lake.s), steps_left))
            if terminated or truncated:
                break
        wins += info["success"]
    expected = plan.success[8, env.start_state]
    assert abs(wins / 2000 - expected) < 4 * np.sqrt(expected * (1 - expected) / 2000) + 1e-9


def sokoban(xsb):
    rows = xsb.split("\n")
    env = gym.make("envs_visual/Sokoban-v0", dim_room=(len(rows), len(rows[0]))).unwrapped
    env.reset(seed=0, options={"level": xsb})
    return env


def test_sokoban_teacher_plans_from_the_current_state():
    env = sokoban("######\n#@ $.#\n######")
    assert env.optimal_actions(5) == [RIGHT, RIGHT]
    assert env.optimal_actions(1) == [RIGHT]
    env.step(RIGHT)
    assert env.optimal_actions(5) == [RIGHT]
    env.step(RIGHT)
    assert env.optimal_actions(5) == []  # solved
    stuck = sokoban("######\n#$@ .#\n######")
    assert stuck.optimal_actions(5) == []  # the box is against the wall: no solution


def test_env_hooks_stand_in_for_frozenlake_internals():
    """The planner and the optimum's reference read the env's hooks (envs_visual.contract): FrozenLake's
    `planned_action` is the value-iteration move on slippery ice and None on plain ice, `optimal_success`
    the optimum's success from the start; MiniGrid has no planner, so the planner teacher plays the solver."""
    slippery = frozen_lake(["SFF", "FHF", "FFG"], slippery=True)
    assert slippery.planned_action() == slippery.optimal_plan(100).action(0, 100)
    assert slippery.optimal_success(4) == slippery.optimal_plan(4).success[4, 0]
    assert frozen_lake(["SG", "FF"]).planned_action() is None
    minigrid = gym.make("envs_visual/MiniGrid-v0").unwrapped
    minigrid.reset(seed=3)
    rng = np.random.default_rng(0)
    assert planner_teacher(minigrid, 2, rng)[0] == minigrid.optimal_actions(2) == [FORWARD, FORWARD]
    assert teacher_available(minigrid, "planner") and not teacher_available(object(), "solver")
    assert teacher_available(object(), "format")
