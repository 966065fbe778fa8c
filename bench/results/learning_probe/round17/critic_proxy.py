"""Can the slippery recipe's Q critic (vagen FeatureCritic: an MLP on the env's one-hot state features)
rank the actions right on UNSEEN layouts? Regress it on exact action values (x the goal reward 10) of
every non-terminal state of the training layouts, then score its greedy policy argmax_a Q(s, a) exactly
on the 512 held-out validation levels and on 512 training layouts.

    python critic_proxy.py --target optimal   # Q* with 16 steps left (value iteration)
    python critic_proxy.py --target random    # Q of the uniform random policy (the first iteration's)
    python critic_proxy.py --features egocentric  # the map seen from the player (eighteenth round)
    python critic_proxy.py --critic-net conv  # convolutions over the map's planes (nineteenth round)
"""

import argparse
import time

import numpy as np
import torch
from slippery_maps import REWARD, H, add_critic_options, load_maps, make_critic, mean_success, view_inputs


def random_policy_values(T: np.ndarray, goal: np.ndarray, hole: np.ndarray) -> np.ndarray:
    """(S, A) success probability within H steps of one action, then the uniform random policy."""
    v = goal.astype(float)
    for _ in range(H - 1):
        v = np.where(goal, 1.0, np.where(hole, 0.0, (T @ v).mean(axis=1)))
    return T @ v


p = argparse.ArgumentParser()
p.add_argument("--target", default="optimal", choices=["optimal", "random"])
p.add_argument("--hidden", type=int, nargs="+", default=[256])
p.add_argument("--steps", type=int, nargs="+", default=[1200])
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--batch", type=int, default=3000)
add_critic_options(p)
args = p.parse_args()
torch.set_num_threads(1)
t0 = time.time()
maps, train_keys, val_keys = load_maps()
for m in maps.values():
    exact = (
        m["T"] @ m["plan"].success[H - 1]
        if args.target == "optimal"
        else random_policy_values(m["T"], m["goal"], m["hole"])
    )
    m["q"] = REWARD * exact
train_eval = train_keys[:512]


def report(name: str, policy_of) -> str:
    held_out, training = mean_success(maps, val_keys, policy_of), mean_success(maps, train_eval, policy_of)
    return f"{name}: held-out {held_out:.3f}, training {training:.3f}"


print(
    f"{len(train_keys)} training layouts, the 512 validation levels hold {len(set(val_keys))}; optimum: "
    f"held-out {np.mean([maps[k]['opt'] for k in val_keys]):.3f}, training "
    f"{np.mean([maps[k]['opt'] for k in train_eval]):.3f}; "
    f"{report('argmax of the exact target', lambda k: maps[k]['q'].argmax(1))}; "
    f"{report('solver', lambda k: maps[k]['solver'])}; "
    f"{report('always Down (blind)', lambda k: np.full(16, 1))} ({time.time() - t0:.0f}s)",
    flush=True,
)

rows = [(k, s) for k in train_keys for s in range(16) if maps[k]["acting"][s]]
view = view_inputs(maps, args.features)
inputs = torch.tensor(np.array([view[k][s] for k, s in rows]))
targets = torch.tensor(np.array([maps[k]["q"][s] for k, s in rows]), dtype=torch.float32)
for hidden in args.hidden:
    for steps in args.steps:
        torch.manual_seed(0)
        critic = make_critic(args, inputs.shape[1], hidden)
        optim = torch.optim.AdamW(critic.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
        t0 = time.time()
        for _ in range(steps):
            idx = torch.randint(len(targets), (args.batch,))
            loss = torch.nn.functional.mse_loss(critic.values(inputs[idx]), targets[idx])
            optim.zero_grad()
            loss.backward()
            optim.step()

        def policy_of(k: str, critic=critic) -> np.ndarray:
            x = torch.tensor(view[k])
            with torch.no_grad():
                return critic.values(x).argmax(1).numpy()

        agree = np.mean(
            [(policy_of(k) == maps[k]["q"].argmax(1))[maps[k]["acting"]].mean() for k in val_keys]
        )
        print(
            f"target {args.target}, {args.features} features, {args.critic_net} critic, hidden {hidden}, "
            f"{steps} steps of {args.batch}: mse {loss.item():.4f}; "
            f"{report('greedy on the critic', policy_of)}; its argmax is the target's on {agree:.2f} of "
            f"the held-out states ({time.time() - t0:.0f}s)",
            flush=True,
        )
