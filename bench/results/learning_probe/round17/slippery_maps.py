"""Slippery 4x4 FrozenLake layouts for the round-17 probes: the benchmark's hash split (training layouts,
the 512 validation levels' layouts), each with its transition tensor, value-iteration optimum and the
env's one-hot state features; exact success of a stationary policy (envs_visual's policy_success)."""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import envs_visual  # noqa: F401
from envs_visual.frozenlake.planning import (
    policy_success,
    shortest_path_actions,
    transition_tensor,
    value_iteration,
)
from vagen.models.state_critic import FeatureCritic
from vagen.rollout.seeds import is_held_out

H, REWARD = 16, 10.0  # the recipe's step budget and goal reward


def load_maps(seeds: int = 20000) -> tuple[dict, list[str], list[str]]:
    """(maps by layout key, training keys, the 512 validation levels' keys in level order)."""
    env = gym.make("envs_visual/FrozenLake-v0", size=4, is_slippery=True, max_steps=H).unwrapped
    maps, train_keys, val_keys = {}, [], []
    for seed in range(seeds):
        env.reset(seed=seed)
        key = env.layout_key
        if key not in maps:
            letters = np.array(list("".join(env.desc)))
            plan = value_iteration(env.desc, env.lake.P, H)
            maps[key] = dict(
                desc=list(env.desc),
                P=env.lake.P,
                T=transition_tensor(env.lake.P, 16),
                goal=letters == "G",
                hole=letters == "H",
                acting=~((letters == "G") | (letters == "H")),
                tiles=env.state_features()[: -letters.size],  # the layout's part; the player's follows
                s0=env.start_state,
                plan=plan,
                opt=plan.success[H, env.start_state],
                solver=[(shortest_path_actions(env.desc, divmod(s, 4), 1) or [0])[0] for s in range(16)],
            )
            if not is_held_out(key, 0.2):
                train_keys.append(key)
        if is_held_out(key, 0.2) and len(val_keys) < 512:
            val_keys.append(key)
    return maps, train_keys, val_keys


def features(tiles: np.ndarray, cell: int) -> np.ndarray:
    """FrozenLakeEnv.state_features() of the player on `cell`."""
    return np.concatenate([tiles, np.eye(16, dtype=np.float32)[cell]])


def mean_success(maps: dict, keys: list[str], policy_of) -> float:
    """Mean exact success of the stationary policies policy_of(key) (16,) from each layout's start."""
    return float(
        np.mean([policy_success(maps[k]["desc"], maps[k]["P"], policy_of(k), maps[k]["s0"], H) for k in keys])
    )


def policy_q(m: dict, probs: np.ndarray, gamma: float, sweeps: int = 200) -> np.ndarray:
    """Exact Q(s, .) (16, 4) of the stationary policy `probs` (16, 4) on the map `m`, reward REWARD on
    reaching the goal, goal and hole terminal, no step budget: Q = T (r + gamma (1 - terminal) V),
    V = sum_a pi Q, by `sweeps` sweeps of policy evaluation (within 1e-4 of the linear solve for a
    uniform policy on 200 validation layouts at gamma 0.95 and 0.98)."""
    values = np.zeros(16)
    for _ in range(sweeps):
        q = action_values(m, values, gamma)
        values = (probs * q).sum(1)
    return q


def action_values(m: dict, values: np.ndarray, gamma: float, reward: float = REWARD) -> np.ndarray:
    """One Bellman backup on the map `m`: Q(s, a) = sum_s' T(s, a, s') (reward goal(s') + gamma (1 -
    terminal(s')) V(s')), (16, 4) from V (16,); goal and hole cells are terminal."""
    terminal = m["goal"] | m["hole"]
    return m["T"] @ (reward * m["goal"] + gamma * np.where(terminal, 0.0, values))


EGOCENTRIC = gym.make(
    "envs_visual/FrozenLake-v0", size=4, is_slippery=True, state_view="egocentric"
).unwrapped


def egocentric_features(desc: list[str], cell: int) -> np.ndarray:
    """FrozenLakeEnv.state_features() with state_view="egocentric" of the player on `cell` of `desc`."""
    EGOCENTRIC.reset(options={"map": desc})  # the map is rebuilt only when it changes
    EGOCENTRIC.lake.s = cell
    return EGOCENTRIC.state_features()


def add_view_option(parser: argparse.ArgumentParser, flag: str, reader: str) -> None:
    """`flag` picks what `reader` reads: the env's state_features() with state_view layout or egocentric."""
    parser.add_argument(
        flag,
        choices=["layout", "egocentric"],
        default="layout",
        help=f"{reader}'s input: the map's tiles row-major and the player's cell, or the map seen from the "
        "player",
    )


def view_inputs(maps: dict, view: str) -> dict[str, np.ndarray]:
    """Every layout's (16, F) state features of the player on each cell, in `view`."""
    return {
        key: np.stack(
            [
                egocentric_features(m["desc"], s) if view == "egocentric" else features(m["tiles"], s)
                for s in range(16)
            ]
        )
        for key, m in maps.items()
    }


class ConvCritic(nn.Module):
    """Q(s, .) from the layout view (`features`): 3 x 3 convolutions over the map's tile planes (zero
    padding: off the map) give every cell's four action values at once; the player's one-hot reads its
    cell's. The same weights on every cell, as the egocentric view shares its inputs (nineteenth round)."""

    def __init__(self, layers: int = 4, width: int = 64) -> None:
        super().__init__()
        convs, channels = [], 3
        for _ in range(layers):
            convs += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
        self.net = nn.Sequential(*convs, nn.Conv2d(channels, 4, 1))

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 4) from (N, 64) layout features: tiles (16 cells x ice, hole, goal), then the player's cell."""
        tiles = x[:, :48].reshape(-1, 4, 4, 3).permute(0, 3, 1, 2)
        q_map = self.net(tiles).flatten(2)  # (N, 4 actions, 16 cells)
        return (q_map * x[:, None, 48:]).sum(-1)


def add_critic_options(parser: argparse.ArgumentParser) -> None:
    """--features (the critic's view) and --critic-net (its network), read by `make_critic`."""
    add_view_option(parser, "--features", "the critic")
    parser.add_argument(
        "--critic-net",
        choices=["mlp", "conv"],
        default="mlp",
        help="the recipe's FeatureCritic MLP, or ConvCritic (layout view only: it reads the map's planes)",
    )


def make_critic(args: argparse.Namespace, in_features: int, hidden: int = 256) -> nn.Module:
    """A Q critic of four actions on `in_features` state features, as `add_critic_options` parsed it
    (`hidden`: the MLP's width)."""
    if args.critic_net == "mlp":
        return FeatureCritic(in_features, hidden=hidden, outputs=4)
    if args.features != "layout":
        raise ValueError("--critic-net conv reads the layout view's planes: drop --features egocentric")
    return ConvCritic()
