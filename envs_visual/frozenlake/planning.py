"""Teachers for FrozenLake: BFS shortest paths (non-slippery) and finite-horizon value iteration on
gymnasium's true transition model (slippery ice).

Value iteration: with S_goal the goal cells and S_hole the holes, the probability of reaching the goal
within k steps from s under the best policy is
    V_0(s) = 1[s in S_goal],   V_k(s) = 1 for s in S_goal,   V_k(s) = 0 for s in S_hole,
    V_k(s) = max_a sum_s' P(s' | s, a) V_{k-1}(s')   otherwise,
and pi_k(s) = argmax_a of that sum (the first best action in action-id order on ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs_visual.paths import goal_distances

# Action ids: 0 Up, 1 Down, 2 Left, 3 Right (envs_visual.frozenlake.env.ACTION_NAMES).
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
GYM_ACTIONS = (3, 1, 0, 2)  # our action id -> gymnasium FrozenLakeEnv's (LEFT=0, DOWN=1, RIGHT=2, UP=3)


def shortest_path_actions(desc: list[str], start: tuple[int, int], max_actions: int) -> list[int]:
    """The first `max_actions` actions (action ids) of a shortest non-slippery path from
    `start` to a goal; at each cell the first action in action-id order that gets one step closer.
    Empty when `start` is a goal, a hole, or cut off from every goal."""
    distance = goal_distances(desc)
    rows, cols = len(desc), len(desc[0])
    cell, actions = start, []
    if desc[start[0]][start[1]] in "GH":
        return actions
    while cell in distance and distance[cell] > 0 and len(actions) < max_actions:
        for action, (d_row, d_col) in enumerate(MOVES):
            ahead = (cell[0] + d_row, cell[1] + d_col)
            in_grid = 0 <= ahead[0] < rows and 0 <= ahead[1] < cols
            if in_grid and distance.get(ahead, -1) == distance[cell] - 1:
                actions.append(action)
                cell = ahead
                break
    return actions


@dataclass
class SlipperyPlan:
    """Finite-horizon optimum on a FrozenLake map. S = rows * cols states (flat index row * cols + col).

    success: (H + 1, S) float64, success[k, s] = best probability of reaching a goal within k steps from s
    policy:  (H, S) long, policy[k - 1, s] = the best action (action id) with k steps left
    """

    success: np.ndarray
    policy: np.ndarray

    def action(self, state: int, steps_left: int) -> int:
        return int(self.policy[steps_left - 1, state])


def transition_tensor(transitions: dict, num_states: int) -> np.ndarray:
    """gymnasium's `P[s][gym_action] = [(prob, next_s, reward, terminated), ...]` -> T (S, 4, S)
    indexed by OUR action ids (duplicate outcomes add up)."""
    tensor = np.zeros((num_states, len(GYM_ACTIONS), num_states))
    for state in range(num_states):
        for action, gym_action in enumerate(GYM_ACTIONS):
            for prob, next_state, _, _ in transitions[state][gym_action]:
                tensor[state, action, next_state] += prob
    return tensor


def value_iteration(desc: list[str], transitions: dict, horizon: int) -> SlipperyPlan:
    """Optimal success probability and policy for every number of steps left up to `horizon` (formula in
    the module docstring); `transitions` is gymnasium's FrozenLakeEnv.P for the map `desc`."""
    letters = np.array(list("".join(desc)))
    goal, hole = letters == "G", letters == "H"
    tensor = transition_tensor(transitions, letters.size)  # (S, A, S)
    success = np.zeros((horizon + 1, letters.size))
    policy = np.zeros((horizon, letters.size), dtype=np.int64)
    success[0] = goal
    for k in range(1, horizon + 1):
        action_values = tensor @ success[k - 1]  # (S, A)
        policy[k - 1] = action_values.argmax(axis=1)
        success[k] = np.where(goal, 1.0, np.where(hole, 0.0, action_values.max(axis=1)))
    return SlipperyPlan(success, policy)


def policy_success(desc: list[str], transitions: dict, policy: np.ndarray, start: int, horizon: int) -> float:
    """Exact probability that the stationary `policy` (S,) of action ids reaches a goal within `horizon`
    steps from `start`: the state distribution d_{k+1} = d_k P_pi with goal and hole cells absorbing
    (their mass leaves d after the step that reaches them), summed over the goal cells."""
    letters = np.array(list("".join(desc)))
    goal, hole = letters == "G", letters == "H"
    tensor = transition_tensor(transitions, letters.size)  # (S, A, S)
    step = tensor[np.arange(letters.size), np.asarray(policy)]  # (S, S) under the policy
    dist = np.zeros(letters.size)
    dist[start] = 1.0
    total = 0.0
    for _ in range(horizon):
        dist = dist @ step
        total += dist[goal].sum()
        dist[goal | hole] = 0.0
    return float(total)
