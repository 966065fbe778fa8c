"""Shortest distances on a text grid (envs_visual.paths)."""

from envs_visual.paths import goal_distances


def test_goal_distances_count_steps_around_blocked_cells_and_leave_out_cut_off_ones():
    grid = ["..L.", "LL.G", "...W"]
    assert goal_distances(grid, blocked="LW") == {
        (1, 3): 0,
        (0, 3): 1,
        (1, 2): 1,
        (2, 2): 2,
        (2, 1): 3,
        (2, 0): 4,
    }
    assert goal_distances(["FH", "HG"]) == {(1, 1): 0}  # FrozenLake's default: holes block
