"""Scratch probe (round 10, not project code): MPO with a privileged Q(s, a) critic, outside the pipeline.

Policy: the tiny VLM's logits over the 4 action-name tokens after "<answer>" (one image, a short prompt,
one batched forward per decision). Critic: an MLP on the true state, refit by expected SARSA (30
full-batch steps per iteration); by default on the (map, player) one-hot planes, with --byte-critic on
the text grid (vagen's StateCritic, or --onehot-bytes a one-hot per (position, byte)). Policy update:
cross-entropy to q ~ ((1 - mix) pi_old + mix / 4) exp((Q - V) / tau) over all four actions.
Validation: greedy from S on held-out (hash split) layouts. Runs of the probe README's tenth round, e.g.
  Q2: --mb-size 64 --epochs 2 --tau 0.5 --eps-mix 0.1
  L2: the same + --pipeline-prompt --init <the format warm start>   (L8: + --seed 1)
  L4: L2 + --byte-critic;  L5: L2 + --byte-critic --onehot-bytes;  L9: L5 + --small-init
  L10: L2 with --init <the frozenlake_mpo_tiny warm start> --pipeline-critic-optim
  L11: L10 + --full-vocab  (L12: + --seed 1)
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.envs.toy_text.frozen_lake import generate_random_map
from transformers import AutoModelForImageTextToText, AutoProcessor

from envs_visual.frozenlake.env import VisualFrozenLakeEnv
from vagen.models.loading import model_inputs
from vagen.models.tiny import tiny_model_path
from vagen.rollout.seeds import is_held_out

p = argparse.ArgumentParser()
p.add_argument("--minutes", type=float, default=30)
p.add_argument("--envs", type=int, default=256)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--critic-lr", type=float, default=3e-3)
p.add_argument("--gamma", type=float, default=0.9)
p.add_argument("--lam", type=float, default=0.9)
p.add_argument("--minibatches", type=int, default=4)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--mb-size", type=int, default=0)
p.add_argument("--eps-mix", type=float, default=0.0)
p.add_argument("--random-start", type=float, default=0.5)
p.add_argument("--entropy", type=float, default=0.0)
p.add_argument("--policy", default="mpo", choices=["mpo", "mac"])
p.add_argument("--tau", type=float, default=1.0)
p.add_argument("--val-every", type=int, default=10)
p.add_argument("--val-maps", type=int, default=128)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--tiles", default="flat")
p.add_argument("--out", default="runs/probe10/lean.jsonl")
p.add_argument("--init", default="")
p.add_argument("--pipeline-prompt", action="store_true")
p.add_argument("--byte-critic", action="store_true")
p.add_argument("--onehot-bytes", action="store_true")
p.add_argument("--small-init", action="store_true")
p.add_argument("--full-vocab", action="store_true", help="action log-probs over the whole vocabulary")
p.add_argument("--pipeline-critic-optim", action="store_true", help="AdamW betas (0.9, 0.98), wd 0.01")
args = p.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
rng = np.random.default_rng(args.seed)

path = args.init or tiny_model_path("tiny-vlm")
model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
processor = AutoProcessor.from_pretrained(path)
tok = processor.tokenizer
config = model.config
prompt = (
    "<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>"
    "Reach the goal. Action?<|im_end|>\n<|im_start|>assistant\n<answer>"
)
prompt_ids = torch.tensor(tok(prompt)["input_ids"])
action_ids = [tok(name, add_special_tokens=False)["input_ids"][0] for name in ("Up", "Down", "Left", "Right")]
if args.pipeline_prompt:
    prompt = (
        "<|im_start|>system\nYou are playing FrozenLake. Actions: Up, Down, Left, Right. "
        "Reply only with your actions inside <answer></answer>.<|im_end|><|im_start|>user\n"
        "Current observation:\n<|vision_start|>"
        + "<|image_pad|>" * 16
        + "<|vision_end|><|im_end|><|im_start|>assistant\n<answer"
    )
    prompt_ids = torch.tensor(tok(prompt)["input_ids"])
    action_ids = [
        tok("<answer>" + n, add_special_tokens=False)["input_ids"][1] for n in ("Up", "Down", "Left", "Right")
    ]
print("prompt tokens", len(prompt_ids), "action ids", action_ids, [tok.decode([a]) for a in action_ids])

env = VisualFrozenLakeEnv(size=4, max_steps=10, reward_schedule=(10.0, 0.0, 0.0), tile_style=args.tiles)
MOVES = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}  # Up Down Left Right


def layout(seed):
    return "\n".join(generate_random_map(4, 0.8, seed))


# maps: training seeds 0.. skipping held-out layouts; validation seeds 10^6.. with held-out layouts
train_maps, seed = [], 0
while len(train_maps) < 20000:
    lay = layout(seed)
    if not is_held_out(lay, 0.2):
        train_maps.append(lay.split("\n"))
    seed += 1
val_maps, seed = [], 10**6
while len(val_maps) < args.val_maps:
    lay = layout(seed)
    if is_held_out(lay, 0.2):
        val_maps.append(lay.split("\n"))
    seed += 1
print("distinct training layouts", len({"".join(m) for m in train_maps}))

pixel_cache = {}


def pixels(desc, pos):
    key = ("".join(desc), pos)
    if key not in pixel_cache:
        env.reset(options={"map": desc})
        env.lake.s = pos[0] * 4 + pos[1]
        enc = processor.image_processor(images=[env.render()], return_tensors="pt")
        pixel_cache[key] = enc["pixel_values"]
    return pixel_cache[key]


GRID_THW = torch.tensor([[1, 8, 8]])


def policy_logits(states):
    """states: list of (desc, pos) -> (N, 4) logits."""
    n = len(states)
    ids = prompt_ids.repeat(n, 1)
    mask = torch.ones_like(ids)
    pv = torch.cat([pixels(d, q) for d, q in states])
    from vagen.models.vision import VisionInputs

    vis = VisionInputs(pv, GRID_THW.repeat(n, 1))
    out = model(**model_inputs(config, ids, mask, vis), logits_to_keep=1)
    if args.full_vocab:  # log-probs over the whole vocabulary, read at the four action tokens
        return out.logits[:, -1].log_softmax(-1)[:, action_ids]
    return out.logits[:, -1, action_ids]


CELL = {"F": 0, "S": 0, "H": 1, "G": 2}


def state_features(states):
    x = torch.zeros(len(states), 16 * 3 + 16)
    for i, (d, q) in enumerate(states):
        letters = "".join(d)
        for c, ch in enumerate(letters):
            x[i, c * 3 + CELL[ch]] = 1
        x[i, 48 + q[0] * 4 + q[1]] = 1
    return x


critic = torch.nn.Sequential(
    torch.nn.Linear(64, 256),
    torch.nn.ReLU(),
    torch.nn.Linear(256, 256),
    torch.nn.ReLU(),
    torch.nn.Linear(256, 4),
)
if args.byte_critic:
    from vagen.models.state_critic import StateCritic

    byte_critic = StateCritic(256, outputs=4)
    if args.onehot_bytes:

        class OneHotBytes(torch.nn.Module):
            def __init__(self, max_bytes=256, hidden=256, outputs=4):
                super().__init__()
                self.max_bytes = max_bytes
                self.first = torch.nn.Embedding(max_bytes * 257, hidden)
                torch.nn.init.normal_(self.first.weight, std=1 / 17**0.5)
                self.bias = torch.nn.Parameter(torch.zeros(hidden))
                if args.small_init:
                    torch.nn.init.uniform_(self.first.weight, -1 / 8, 1 / 8)
                    torch.nn.init.uniform_(self.bias, -1 / 8, 1 / 8)
                self.rest = torch.nn.Sequential(
                    torch.nn.ReLU(),
                    torch.nn.Linear(hidden, hidden),
                    torch.nn.ReLU(),
                    torch.nn.Linear(hidden, outputs),
                )

            def forward(self, states):
                ids = []
                for st in states:
                    raw = list(st.encode())
                    ids.append([i * 257 + b for i, b in enumerate(raw)])
                width = max(len(x) for x in ids)
                mask = torch.tensor([[1.0] * len(x) + [0.0] * (width - len(x)) for x in ids])
                idx = torch.tensor([x + [0] * (width - len(x)) for x in ids])
                h = (self.first(idx) * mask[..., None]).sum(1) + self.bias
                return self.rest(h)

        byte_critic = OneHotBytes()

    def grid_text(d, q):
        rows = list(d)
        rows[q[0]] = rows[q[0]][: q[1]] + "P" + rows[q[0]][q[1] + 1 :]
        return "\n".join(rows)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = byte_critic

        def forward(self, states):
            return self.c([grid_text(d, q) for d, q in states])

    critic = Wrapped()
    state_features = lambda states: states  # noqa: E731
critic_opt = (
    torch.optim.AdamW(critic.parameters(), lr=args.critic_lr, betas=(0.9, 0.98), weight_decay=0.01)
    if args.pipeline_critic_optim
    else torch.optim.Adam(critic.parameters(), lr=args.critic_lr)
)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)


def step_env(desc, pos, a):
    r, c = pos
    dr, dc = MOVES[a]
    r2, c2 = min(max(r + dr, 0), 3), min(max(c + dc, 0), 3)
    ch = desc[r2][c2]
    if ch == "H":
        return (r2, c2), 0.0, True, False
    if ch == "G":
        return (r2, c2), 10.0, True, True
    return (r2, c2), 0.0, False, False


def start_cell(desc, random_start):
    if rng.random() < random_start:
        cells = [(r, c) for r in range(4) for c in range(4) if desc[r][c] in "FS"]
        return cells[rng.integers(len(cells))]
    return (0, 0)


@torch.no_grad()
def evaluate(maps):
    model.eval()
    pos = [(0, 0)] * len(maps)
    live = list(range(len(maps)))
    wins = 0
    for _ in range(10):
        if not live:
            break
        actions = policy_logits([(maps[i], pos[i]) for i in live]).argmax(-1).tolist()
        nxt = []
        for i, a in zip(live, actions, strict=False):
            pos[i], _, done, win = step_env(maps[i], pos[i], a)
            wins += win
            if not done:
                nxt.append(i)
        live = nxt
    model.train()
    return wins / len(maps)


def wilson(k, n, z=1.96):
    p_ = k / n
    d = 1 + z * z / n
    c = (p_ + z * z / (2 * n)) / d
    h = z * math.sqrt(p_ * (1 - p_) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


log = open(args.out, "w")
t0 = time.time()
it = 0
v0 = evaluate(val_maps)
print(f"it 0 val {v0:.3f}", flush=True)
map_cursor = 0
while time.time() - t0 < args.minutes * 60:
    it += 1
    t_it = time.time()
    maps = [train_maps[(map_cursor + i) % len(train_maps)] for i in range(args.envs)]
    map_cursor += args.envs
    pos = [start_cell(m, args.random_start) for m in maps]
    live = list(range(args.envs))
    traj = [[] for _ in maps]  # (state, action, logp, reward, done)
    with torch.no_grad():
        for _ in range(10):
            if not live:
                break
            states = [(maps[i], pos[i]) for i in live]
            logits = policy_logits(states)
            dist = torch.distributions.Categorical(logits=logits)
            acts = dist.sample()
            logps = dist.log_prob(acts)
            nxt = []
            for j, i in enumerate(live):
                a = int(acts[j])
                new, r, done, win = step_env(maps[i], pos[i], a)
                traj[i].append([states[j], a, float(logps[j]), r, done, win, dist.probs[j]])
                pos[i] = new
                if not done:
                    nxt.append(i)
            live = nxt
    t_roll = time.time() - t_it
    flat = [s for tr in traj for s in tr]
    states = [s[0] for s in flat]
    acts = torch.tensor([s[1] for s in flat])
    old_logp = torch.tensor([s[2] for s in flat])
    probs = torch.stack([s[6] for s in flat])  # (N, 4) rollout-time policy
    rewards = torch.tensor([s[3] for s in flat])
    dones = torch.tensor([float(s[4]) for s in flat])
    # next decision state of each step (None at terminal / last step)
    next_idx = []
    k = 0
    successes = 0
    for tr in traj:
        n = len(tr)
        successes += any(s[5] for s in tr)
        for t in range(n):
            next_idx.append(k + t + 1 if (t + 1 < n) else -1)
        k += n
    next_idx = torch.tensor(next_idx)
    has_next = next_idx >= 0
    feats = state_features(states)
    for _ in range(30):  # expected-SARSA fits of Q on the taken actions
        with torch.no_grad():
            q_all = critic(feats)
            v_next = (probs * q_all).sum(-1)
            boot = torch.where(has_next, v_next[next_idx.clamp_min(0)], torch.zeros(()))
            y = rewards + args.gamma * (1 - dones) * boot
        critic_opt.zero_grad()
        q_taken = critic(feats).gather(1, acts[:, None]).squeeze(1)
        loss_v = 0.5 * (q_taken - y).pow(2).mean()
        loss_v.backward()
        critic_opt.step()
    with torch.no_grad():
        q_all = critic(feats)
        q_taken = q_all.gather(1, acts[:, None]).squeeze(1)
        ev = 1 - float(((y - q_taken) ** 2).mean() / y.var().clamp_min(1e-8))
        base = (probs * q_all).sum(-1, keepdim=True)
        adv_all = q_all - base  # (N, 4)
        target = torch.softmax(
            torch.log((1 - args.eps_mix) * probs + args.eps_mix / 4) + adv_all / args.tau, -1
        )
    t_up = time.time()
    kls, ents = [], []
    for _ in range(args.epochs):
        order = torch.randperm(len(flat))
        for mb in order.split(args.mb_size) if args.mb_size else order.tensor_split(args.minibatches):
            logits = policy_logits([states[j] for j in mb.tolist()])
            logp_all = logits if args.full_vocab else F.log_softmax(logits, -1)
            logp = logp_all.gather(1, acts[mb, None]).squeeze(1)
            if args.policy == "mpo":
                pg = -(target[mb] * logp_all).sum(-1).mean()
            else:
                pg = -(logp_all.exp() * adv_all[mb]).sum(-1).mean()
            ent = -(logp_all.exp() * logp_all).sum(-1).mean()
            loss = pg - args.entropy * ent
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            kls.append(float((old_logp[mb] - logp.detach()).mean()))
            ents.append(float(ent))
    t_update = time.time() - t_up
    rec = dict(
        it=it,
        minutes=(time.time() - t0) / 60,
        train_success=successes / len(maps),
        decisions=len(flat),
        ev=ev,
        entropy=float(np.mean(ents)),
        kl=float(np.mean(kls)),
        t_roll=t_roll,
        t_update=t_update,
    )
    if it % args.val_every == 0:
        val = evaluate(val_maps)
        rec["val"] = val
        rec["val_ci"] = wilson(round(val * len(val_maps)), len(val_maps))
    log.write(json.dumps(rec) + "\n")
    log.flush()
    print(
        " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()), flush=True
    )
final = evaluate(val_maps)
print(f"final val {final:.3f} at {(time.time() - t0) / 60:.1f} min, {it} iterations", flush=True)
log.write(json.dumps({"final_val": final, "minutes": (time.time() - t0) / 60, "it": it}) + "\n")
