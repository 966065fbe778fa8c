"""The slippery MPO recipe's update in a lean loop, with perfect perception and an actor that can fit:
does MPO with the recipe's critic regime find the optimum on unseen layouts in ~30 iterations?

Actor and critic are both vagen FeatureCritic MLPs on the env's one-hot state features (the actor's 4
outputs are logits). Each iteration: 256 episodes on random training layouts (half from a random cell),
16 steps, actions sampled from the actor, slips from the true transition model, reward 10 at the goal;
the critic refit on the batch by expected SARSA (`--critic-steps` full-batch steps, vagen.algo.mpo's
targets); the actor fit to q(a|s) = vagen.algo.mpo.mpo_targets(Q, pi_old, eta, mix) by cross-entropy
(`--epochs` x `--mini-batches` steps). Every 5 iterations: exact held-out success of the actor's and of
the critic's greedy policies on the 512 validation levels (with --train-maps, the actor's on those
maps too). No KL anchor, no reply tokens.

    python mpo_loop_proxy.py --critic-steps 30 200 1000

Eighteenth round: `--target max` (Q-learning targets, with `--replay 0`: every batch so far),
`--features egocentric` (the critic reads the map seen from the player, the env's
state_view="egocentric"), `--actor-features egocentric` (the actor too). Nineteenth: `--critic-net conv`
(slippery_maps.ConvCritic: convolutions over the layout's planes). Twentieth: `--lam` (the critic's
targets are lambda-returns, bootstrapped on sum_a pi_old Q), `--decay` (the actor's lr falls linearly to 0
over the run). Twenty-first: every 5 iterations the critic is compared with the exact Q of the rollout
policy on the batch's turns (slippery_maps.policy_q: its greedy action agrees, correlation of the
advantages, regret of its greedy action under the exact Q); `--oracle` fits the actor to targets from
that exact Q instead of the critic's (the update's ceiling with a perfect critic); `--bootstrap-timeout`
bootstraps the critic's target on the turn the 16-step budget ends (the critic sees no clock).
"""

import argparse
import time

import numpy as np
import torch
from slippery_maps import (
    REWARD,
    H,
    add_critic_options,
    add_view_option,
    load_maps,
    make_critic,
    mean_success,
    policy_q,
    view_inputs,
)

from vagen.algo.mpo import expected_sarsa_targets, mpo_targets
from vagen.models.state_critic import FeatureCritic

p = argparse.ArgumentParser()
p.add_argument("--critic-steps", type=int, nargs="+", default=[30])
p.add_argument("--iterations", type=int, default=30)
p.add_argument("--decay", action="store_true", help="the actor's lr falls linearly to 0 over the run")
p.add_argument("--lam", type=float, default=0.0, help="critic targets: lambda-returns (0: expected SARSA)")
p.add_argument("--episodes", type=int, default=256)
p.add_argument("--oracle", action="store_true", help="the actor's targets from the exact Q of pi_old")
p.add_argument(
    "--bootstrap-timeout", action="store_true", help="bootstrap the critic's target when the budget ends"
)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--mini-batches", type=int, default=16)
p.add_argument("--actor-lr", type=float, default=1e-3)
p.add_argument("--critic-lr", type=float, default=3e-3)
p.add_argument("--gamma", type=float, default=0.98)
p.add_argument("--eta", type=float, default=0.25)
p.add_argument("--mix", type=float, default=0.1)
p.add_argument("--random-start", type=float, default=0.5)
p.add_argument("--seed", type=int, default=0)
p.add_argument(
    "--replay", type=int, default=1, help="the critic fits the last N batches (1: this one, 0: all)"
)
p.add_argument(
    "--target",
    choices=["sarsa", "max"],
    default="sarsa",
    help="critic target: expected SARSA under the actor, or Q-learning's max over next actions",
)
p.add_argument("--epsilon", type=float, default=0.0, help="rollouts act uniformly at random this often")
p.add_argument("--train-maps", type=int, default=0, help="play only the first N training layouts (0: all)")
add_view_option(p, "--actor-features", "the actor")
add_critic_options(p)
args = p.parse_args()
if args.lam > 0 and args.replay != 1:
    raise SystemExit("--lam needs --replay 1: the returns follow the episodes of the current batch")
torch.set_num_threads(1)
maps, train_keys, val_keys = load_maps()
train_keys = train_keys[: args.train_maps or None]


state_inputs, critic_inputs = (
    {k: torch.tensor(x) for k, x in view_inputs(maps, view).items()}
    for view in (args.actor_features, args.features)
)


def lambda_returns(batch: dict[str, torch.Tensor], next_values: torch.Tensor, lam: float) -> torch.Tensor:
    """G_t = r_t + gamma has_next_t ((1 - lam) V(s_t+1) + lam G_t+1), backwards over each episode."""
    where = (batch["episode"], batch["time"])

    def by_episode(x: torch.Tensor) -> torch.Tensor:  # (turns,) -> (episodes, H), zero past the end
        return torch.zeros(args.episodes, H).index_put_(where, x.float())

    rewards, going_on = by_episode(batch["rewards"]), by_episode(batch["has_next"])
    values = by_episode(next_values)
    returns, ahead = torch.zeros(args.episodes, H), torch.zeros(args.episodes)
    for t in range(H - 1, -1, -1):
        ahead = rewards[:, t] + args.gamma * going_on[:, t] * ((1 - lam) * values[:, t] + lam * ahead)
        returns[:, t] = ahead
    return returns[where]


def critic_vs_exact(q: torch.Tensor, exact: torch.Tensor, probs: torch.Tensor) -> str:
    """How well the critic's Q (N, 4) ranks the actions of the batch's turns against the exact Q of the
    policy `probs` (N, 4): its greedy action agrees, correlation of the advantages Q - sum_a pi Q, and
    the regret max_a Q* - Q*(s, argmax_a Q) in reward units (Q* the exact Q)."""
    agree = (q.argmax(-1) == exact.argmax(-1)).float().mean()
    advantages = [(x - (probs * x).sum(-1, keepdim=True)).flatten() for x in (q, exact)]
    corr = torch.corrcoef(torch.stack(advantages))[0, 1]
    regret = (exact.amax(-1) - exact.gather(1, q.argmax(-1, keepdim=True)).squeeze(1)).mean()
    return f"agree {agree:.2f} corr {corr:.2f} regret {regret:.3f}"


def greedy(net: torch.nn.Module, inputs: dict[str, torch.Tensor]):
    def policy_of(k: str) -> np.ndarray:
        with torch.no_grad():
            return net.values(inputs[k]).argmax(1).numpy()

    return policy_of


def rollout(actor: FeatureCritic, rng: np.random.Generator, with_exact_q: bool) -> dict[str, torch.Tensor]:
    """One batch of episodes: every acting turn's layout, cell, action, reward, next cell, has_next, and
    (with_exact_q) the exact Q(s_t, .) of the policy that played it."""
    turns = []
    successes = 0
    exact_q = {}
    for episode in range(args.episodes):
        key = train_keys[rng.integers(len(train_keys))]
        m = maps[key]
        cell = m["s0"] if rng.random() >= args.random_start else int(rng.choice(np.flatnonzero(m["acting"])))
        with torch.no_grad():
            probs = torch.softmax(actor.values(state_inputs[key]), -1).numpy().astype(float)
        if with_exact_q and key not in exact_q:
            exact_q[key] = policy_q(m, probs, args.gamma)
        for t in range(H):
            explore = args.epsilon > 0 and rng.random() < args.epsilon  # no draw at 0: same stream as before
            action = rng.integers(4) if explore else rng.choice(4, p=probs[cell] / probs[cell].sum())
            nxt = int(rng.choice(16, p=m["T"][cell, action]))
            done = bool(m["goal"][nxt] or m["hole"][nxt])
            going_on = not done and (args.bootstrap_timeout or t < H - 1)
            turns.append((key, cell, action, REWARD * m["goal"][nxt], nxt, going_on, episode, t))
            successes += int(m["goal"][nxt])
            cell = nxt
            if done:
                break
    keys, cells, actions, rewards, nexts, has_next, episodes, times = zip(*turns, strict=True)
    return dict(
        states=torch.stack([state_inputs[k][c] for k, c in zip(keys, cells, strict=True)]),
        next_states=torch.stack([state_inputs[k][c] for k, c in zip(keys, nexts, strict=True)]),
        critic_states=torch.stack([critic_inputs[k][c] for k, c in zip(keys, cells, strict=True)]),
        critic_next_states=torch.stack([critic_inputs[k][c] for k, c in zip(keys, nexts, strict=True)]),
        actions=torch.tensor(actions),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        has_next=torch.tensor(has_next),
        episode=torch.tensor(episodes),
        time=torch.tensor(times),
        success_rate=torch.tensor(successes / args.episodes),
    ) | (
        {"exact_q": torch.tensor(np.stack([exact_q[k][c] for k, c in zip(keys, cells, strict=True)])).float()}
        if with_exact_q
        else {}
    )


for critic_steps in args.critic_steps:
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    actor = FeatureCritic(next(iter(state_inputs.values())).shape[1], outputs=4)
    critic = make_critic(args, next(iter(critic_inputs.values())).shape[1])
    actor_optim = torch.optim.AdamW(
        actor.parameters(), lr=args.actor_lr, betas=(0.9, 0.98), weight_decay=0.01
    )
    critic_optim = torch.optim.AdamW(
        critic.parameters(), lr=args.critic_lr, betas=(0.9, 0.98), weight_decay=0.01
    )
    # --decay: iteration i fits the actor at lr (1 - (i - 1) / iterations)
    decay = torch.optim.lr_scheduler.LinearLR(actor_optim, 1.0, 0.0, args.iterations) if args.decay else None
    t0 = time.time()
    setting = (
        f"critic steps {critic_steps}, replay {args.replay}, {args.episodes} episodes, epsilon {args.epsilon}"
        + (f", {args.target} targets" if args.target != "sarsa" else "")
        + (f", {args.features} critic" if args.features != "layout" else "")
        + (f", {args.actor_features} actor" if args.actor_features != "layout" else "")
        + (f", {args.critic_net} critic net" if args.critic_net != "mlp" else "")
        + (f", lambda-returns {args.lam}" if args.lam > 0 else "")
        + (", actor lr decay" if args.decay else "")
        + (f", gamma {args.gamma:g}" if args.gamma != 0.98 else "")
        + (f", critic lr {args.critic_lr:g}" if args.critic_lr != 3e-3 else "")
        + (", bootstrap at the budget's end" if args.bootstrap_timeout else "")
        + (", actor fit to the exact Q (oracle)" if args.oracle else "")
    )
    line = [f"{setting}, {len(train_keys)} maps:"]
    if args.train_maps:
        optimum = np.mean([maps[k]["opt"] for k in train_keys])
        solver = mean_success(maps, train_keys, lambda k: maps[k]["solver"])
        line.append(f"optimum on the training maps {optimum:.3f}, solver {solver:.3f};")
    replay: list[dict[str, torch.Tensor]] = []
    for iteration in range(1, args.iterations + 1):
        batch = rollout(actor, rng, with_exact_q=args.oracle or iteration % 5 == 0)  # read then only
        replay = [*replay, batch][-args.replay :] if args.replay else [*replay, batch]
        fit = {
            name: torch.cat([b[name] for b in replay])
            for name in (
                "critic_states",
                "critic_next_states",
                "next_states",
                "actions",
                "rewards",
                "has_next",
            )
        }
        with torch.no_grad():
            old_probs = torch.softmax(actor.values(batch["states"]), -1)
            next_probs = torch.softmax(actor.values(fit["next_states"]), -1)  # Q of the current policy
        for _ in range(critic_steps):
            q = critic.values(fit["critic_states"])
            with torch.no_grad():
                next_q = critic.values(fit["critic_next_states"])
                next_values = next_q.amax(-1) if args.target == "max" else (next_probs * next_q).sum(-1)
                if args.lam > 0:
                    y = lambda_returns(batch, next_values, args.lam)
                else:
                    y = expected_sarsa_targets(fit["rewards"], next_values, fit["has_next"], args.gamma)
            loss = 0.5 * (q.gather(1, fit["actions"][:, None]).squeeze(1) - y).pow(2).mean()
            critic_optim.zero_grad()
            loss.backward()
            critic_optim.step()
        with torch.no_grad():
            q = critic.values(batch["critic_states"])
            targets = mpo_targets(batch["exact_q"] if args.oracle else q, old_probs, args.eta, args.mix)
        for _ in range(args.epochs):
            for rows in torch.randperm(len(targets)).tensor_split(args.mini_batches):
                logp = torch.log_softmax(actor.values(batch["states"][rows]), -1)
                loss = -(targets[rows] * logp).sum(-1).mean()
                actor_optim.zero_grad()
                loss.backward()
                actor_optim.step()
        if decay is not None:
            decay.step()
        if iteration % 5 == 0:
            held_out = [
                mean_success(maps, val_keys, greedy(net, inputs))
                for net, inputs in ((actor, state_inputs), (critic, critic_inputs))
            ]
            on_training_maps = (
                f" (on the training maps: {mean_success(maps, train_keys, greedy(actor, state_inputs)):.3f})"
                if args.train_maps
                else ""
            )
            ranking = critic_vs_exact(q, batch["exact_q"], old_probs)
            line.append(
                f"it {iteration}: sampled {batch['success_rate']:.2f}, greedy actor {held_out[0]:.3f}, "
                f"critic {held_out[1]:.3f}{on_training_maps} [{ranking}];"
            )
    print(" ".join(line), f"({time.time() - t0:.0f}s)", flush=True)
