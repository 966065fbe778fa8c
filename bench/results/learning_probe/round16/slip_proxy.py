"""Proxy for the slippery target with perfect perception: can a small transformer over the 16 cells
(tile + player flag) imitate the value-iteration policy on UNSEEN layouts well enough (>= 0.276)?
Exact success by propagating the state distribution for H steps (envs_visual's policy_success)."""

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

import envs_visual  # noqa: F401
from envs_visual.frozenlake.planning import policy_success, shortest_path_actions, value_iteration
from vagen.rollout.seeds import is_held_out

p = argparse.ArgumentParser()
p.add_argument("--seeds", type=int, default=20000)
p.add_argument("--layers", type=int, nargs="+", default=[2])
p.add_argument("--dim", type=int, nargs="+", default=[128])
p.add_argument("--train-maps", type=int, nargs="+", default=[0], help="0 = all training layouts")
p.add_argument("--steps", type=int, default=3000)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--batch", type=int, default=64)
p.add_argument(
    "--repr",
    default="cells",
    choices=["cells", "chars"],
    help="chars: the text grid with P, 1-D positions, causal, read at the end (like an LM)",
)
args = p.parse_args()
torch.set_num_threads(args.threads)
H = 16
env = gym.make(
    "envs_visual/FrozenLake-v0", size=4, is_slippery=True, max_steps=H, tile_style="flat"
).unwrapped
TILE = {"S": 0, "F": 0, "H": 1, "G": 2}


t0 = time.time()
maps, train_keys, val_seed_maps = {}, [], []
for seed in range(args.seeds):
    env.reset(seed=seed)
    key = env.layout_key
    if key not in maps:
        letters = np.array(list("".join(env.desc)))
        plan = value_iteration(env.desc, env.lake.P, H)
        solver = np.array([(shortest_path_actions(env.desc, divmod(s, 4), 1) or [0])[0] for s in range(16)])
        maps[key] = dict(
            tiles=np.array([TILE[ch] for ch in letters]),
            desc=list(env.desc),
            P=env.lake.P,
            goal=letters == "G",
            hole=letters == "H",
            s0=env.start_state,
            label=plan.policy[H - 1],
            opt=plan.success[H, env.start_state],
            solver=solver,
            held=is_held_out(key, 0.2),
        )
        if not maps[key]["held"]:
            train_keys.append(key)
    if maps[key]["held"] and len(val_seed_maps) < 512:
        val_seed_maps.append(key)
print(
    f"{len(maps)} layouts in {args.seeds} seeds ({len(train_keys)} training), "
    f"{len(set(val_seed_maps))} distinct in 512 validation levels; {time.time() - t0:.0f}s",
    flush=True,
)


def mean_success(keys, policy_of):
    return float(
        np.mean([policy_success(maps[k]["desc"], maps[k]["P"], policy_of(k), maps[k]["s0"], H) for k in keys])
    )


print(
    f"held-out: optimum {np.mean([maps[k]['opt'] for k in val_seed_maps]):.3f}  stationary "
    f"{mean_success(val_seed_maps, lambda k: maps[k]['label']):.3f}  solver "
    f"{mean_success(val_seed_maps, lambda k: maps[k]['solver']):.3f}",
    flush=True,
)


class CellTransformer(torch.nn.Module):
    def __init__(self, dim, layers):
        super().__init__()
        self.tile = torch.nn.Embedding(3, dim)
        self.pos = torch.nn.Embedding(16, dim)
        self.player = torch.nn.Embedding(2, dim)
        layer = torch.nn.TransformerEncoderLayer(
            dim, 4, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(dim, 4)
        self.chars = torch.nn.Embedding(5, dim)  # ice/start, hole, goal, player, newline
        self.char_pos = torch.nn.Embedding(19, dim)
        self.causal = torch.nn.Transformer.generate_square_subsequent_mask(19)

    def forward_chars(self, tiles, player):
        codes = tiles.clone()
        codes[torch.arange(len(player)), player] = 3
        rows = codes.view(-1, 4, 4)
        newline = torch.full((len(player), 4, 1), 4)
        seq = torch.cat([rows, newline], 2).view(-1, 20)[:, :19]
        h = self.body(self.chars(seq) + self.char_pos.weight[None], mask=self.causal, is_causal=True)
        return self.head(h[:, -1])

    def forward(self, tiles, player):  # (B, 16), (B,)
        if args.repr == "chars":
            return self.forward_chars(tiles, player)
        flag = torch.nn.functional.one_hot(player, 16)
        x = self.tile(tiles) + self.pos.weight[None] + self.player(flag)
        h = self.body(x)
        return self.head(h[torch.arange(len(player)), player])


def states_of(keys):
    tiles, players, labels = [], [], []
    for k in keys:
        m = maps[k]
        for s in range(16):
            if not (m["goal"][s] or m["hole"][s]):
                tiles.append(m["tiles"])
                players.append(s)
                labels.append(m["label"][s])
    return torch.tensor(np.array(tiles)), torch.tensor(players), torch.tensor(labels)


rng = np.random.default_rng(0)
for n_maps in args.train_maps:
    keys = train_keys if n_maps == 0 else list(rng.choice(train_keys, n_maps, replace=False))
    tiles, players, labels = states_of(keys)
    for layers in args.layers:
        for dim in args.dim:
            torch.manual_seed(0)
            model = CellTransformer(dim, layers)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            t0 = time.time()
            for _ in range(args.steps):
                idx = torch.randint(len(labels), (args.batch,))
                loss = torch.nn.functional.cross_entropy(model(tiles[idx], players[idx]), labels[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            model.eval()

            def policy_of(k, model=model):
                with torch.no_grad():
                    t = torch.tensor(maps[k]["tiles"])[None].repeat(16, 1)
                    return model(t, torch.arange(16)).argmax(-1).numpy()

            held = mean_success(val_seed_maps, policy_of)
            train = mean_success(keys[:512], policy_of)
            params = sum(p.numel() for p in model.parameters())
            print(
                f"{args.repr} maps {len(keys):5d} layers {layers} dim {dim:4d} ({params / 1e6:.2f}M): "
                f"loss {loss.item():.3f} "
                f"train-maps {train:.3f} held-out {held:.3f}  ({time.time() - t0:.0f}s)",
                flush=True,
            )
