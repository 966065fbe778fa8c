"""What a policy without a clock can reach on the slippery validation layouts: the 16-step success of
the finite-horizon optimum (it may act differently with few steps left) against stationary policies --
its first step's actions kept for the whole episode, and each discount's optimal policy (value iteration
with reward 1 at the goal). The recipe's critic sees no clock, so its greedy policy is one of the latter.

    python stationary_ceilings.py
"""

import numpy as np
from slippery_maps import H, action_values, load_maps, mean_success

GAMMAS = (0.9, 0.95, 0.98, 0.99, 0.999, 1.0)


def discounted_optimal_policy(m: dict, gamma: float, sweeps: int = 500) -> np.ndarray:
    """(16,) the actions of the optimal stationary policy for reward 1 at the goal discounted by gamma
    (goal and hole terminal, no step budget; value iteration)."""
    values = np.zeros(16)
    for _ in range(sweeps):
        q = action_values(m, values, gamma, reward=1.0)  # 1, not REWARD: gamma 1's ties break as recorded
        values = q.max(1)
    return q.argmax(1)


maps, _, val_keys = load_maps()
print(f"{len(val_keys)} validation layouts, 16-step success from the start:")
print(f"  finite-horizon optimum             {np.mean([maps[k]['opt'] for k in val_keys]):.3f}")
first_step = mean_success(maps, val_keys, lambda k: maps[k]["plan"].policy[H - 1])
print(f"  its first step's actions, always   {first_step:.3f}")
for gamma in GAMMAS:
    rate = mean_success(maps, val_keys, lambda k, g=gamma: discounted_optimal_policy(maps[k], g))
    print(f"  optimal for gamma {gamma:<5}            {rate:.3f}")
print(f"  shortest path (solver)             {mean_success(maps, val_keys, lambda k: maps[k]['solver']):.3f}")
