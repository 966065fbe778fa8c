"""The mpo policy update: all-action targets from a privileged Q critic (math: vagen.algo.mpo).

Every turn of the batch gets its env state, reward and whether the episode went on; the turns that
executed an action (and sampled it as one of the K action tokens) get the state critic's Q(s, .), the
rollout policy over the K actions read at that token, and the improved policy q(.|s) that the actor
fits there by cross-entropy. The critic is refit on the same turns' expected-SARSA targets first (MPO
fits the critic before the policy). It needs algo.critic=state and one action per turn; the KL anchor
holds the reply's other tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vagen.algo import masked_mean
from vagen.algo.mpo import action_target_loss, candidate_probs, expected_sarsa_targets, mpo_targets
from vagen.batching import MicroBatch
from vagen.config import RunConfig
from vagen.metrics import MetricAccumulator
from vagen.models.scoring import Scores
from vagen.rollout.batch import RolloutBatch
from vagen.updates.base import Plan, require


@dataclass
class ActionTurns:
    """The N turns of a batch's episodes (episodes in order, turns in order), A of which acted.

    states:   N critic inputs: each turn's TurnRecord field `reads` (its env text grid, `state`, or
              its one-hot state vector, `features`)
    rewards:  (N,) float32 turn rewards
    has_next: (N,) bool, another turn of the same episode follows
    acted:    (A,) long, flat turn index of each acting turn
    actions:  (A,) long, index of its action among the env's action names
    rows, cols: (A,) long, where its action token sits in the batch
    """

    states: list[str] | list[np.ndarray]
    rewards: Tensor
    has_next: Tensor
    acted: Tensor
    actions: Tensor
    rows: Tensor
    cols: Tensor


def action_turns(batch: RolloutBatch, action_tokens: Tensor, reads: str = "state") -> ActionTurns:
    """Gather the turns; an action token whose sampled id is not one of `action_tokens` (K,) (a reply
    that spelled the action with other tokens) leaves its turn out of the acting ones. `reads`: the
    TurnRecord field the critic reads (its `reads`)."""
    turns = [turn for episode in batch.episodes for turn in episode.turns]
    first_turn = torch.tensor([0] + [len(ep.turns) for ep in batch.episodes]).cumsum(0)  # (E + 1,)
    has_next = torch.ones(len(turns), dtype=torch.bool)
    has_next[first_turn[1:] - 1] = False  # the last turn of each episode (empty episodes have none)
    rows, cols = batch.action_token.nonzero(as_tuple=True)  # row-major
    sampled = batch.input_ids[rows, cols].cpu()
    matches = sampled[:, None] == action_tokens.cpu()[None, :]  # (A', K)
    keep = matches.any(dim=1)
    rows, cols = rows[keep.to(rows.device)], cols[keep.to(cols.device)]
    episode = batch.episode_ids[rows].cpu()
    acted = first_turn[episode] + batch.token_turn[rows, cols].cpu()
    return ActionTurns(
        states=[getattr(turn, reads) for turn in turns],
        rewards=torch.tensor([turn.reward for turn in turns], dtype=torch.float32),
        has_next=has_next,
        acted=acted,
        actions=matches[keep].float().argmax(dim=1),
        rows=rows,
        cols=cols,
    )


def rollout_policy(turns: ActionTurns, candidate_logp: Tensor, num_actions: int) -> Tensor:
    """(N, K) pi_old(.|s_t) over the K actions: read at each acting turn's action token from
    candidate_logp (B, L, K); uniform at a turn that did not act."""
    probs = torch.full((len(turns.states), num_actions), 1.0 / num_actions, device=candidate_logp.device)
    probs[turns.acted] = candidate_probs(candidate_logp[turns.rows, turns.cols])
    return probs


def sarsa_regression(
    turns: ActionTurns, probs: Tensor, gamma: float
) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """The Q-critic's regression of one fit step, given its outputs Q(s_t, .) (N, K) on every turn:
    (Q(s_t, a_t), y_t) on the acting turns, y_t the expected-SARSA target from the current Q (a
    semi-gradient target, recomputed every step, so values travel one turn back per step)."""

    def regression(q: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            values = (probs * q).sum(dim=-1)  # (N,) V(s_t) under pi_old
            next_values = torch.cat([values[1:], values.new_zeros(1)])  # the next turn where has_next
            y = expected_sarsa_targets(
                turns.rewards.to(q.device), next_values, turns.has_next.to(q.device), gamma
            )
        taken = q[turns.acted].gather(1, turns.actions[:, None].to(q.device)).squeeze(1)
        return taken, y[turns.acted]

    return regression


@torch.no_grad()
def improved_policy(
    shape: torch.Size, turns: ActionTurns, probs: Tensor, q: Tensor, eta: float, uniform_mix: float
) -> tuple[Tensor, Tensor]:
    """The improved policy at every action token of a (B, L) `shape` batch from Q(s_t, .) (N, K) and
    pi_old (N, K) (vagen.algo.mpo): targets (B, L, K), q(.|s) at each acting turn's action token and 0
    elsewhere (rows sum to 1 or 0), and advantages (B, L), Q(s, a) - V(s) of the action taken (logs)."""
    device = q.device
    targets = torch.zeros((*shape, q.shape[-1]), device=device)
    targets[turns.rows, turns.cols] = mpo_targets(q[turns.acted], probs[turns.acted], eta, uniform_mix)
    values = (probs * q).sum(dim=-1)  # (N,)
    taken = q[turns.acted].gather(1, turns.actions[:, None].to(device)).squeeze(1)
    advantages = torch.zeros(shape, device=device)
    advantages[turns.rows, turns.cols] = taken - values[turns.acted]
    return targets, advantages


def action_target_mask(targets: Tensor) -> Tensor:
    """(B, L, K) targets -> (B, L) bool: the tokens that carry one (a distribution sums to 1)."""
    return targets.sum(dim=-1) > 0.5


@dataclass
class MpoPlan(Plan):
    """A Plan with what `finish` needs: the batch's turns and the rollout policy over the K actions."""

    turns: ActionTurns | None = None
    probs: Tensor | None = None  # (N, K)


class MPOUpdate:
    """Cross-entropy to q(a|s) ~ pi_old(a|s) exp((Q(s, a) - V(s)) / eta) at each turn's action token."""

    scores_actions = True

    def check(self, cfg: RunConfig) -> None:
        require(
            self.critic(cfg) == cfg.algo.critic,
            "algo.critic",
            "policy_loss=mpo needs Q(s, a) of every action: set algo.critic=state",
        )
        require(
            cfg.env.max_actions_per_turn == 1,
            "env.max_actions_per_turn",
            f"policy_loss=mpo grades one action per turn: set it to 1, not {cfg.env.max_actions_per_turn}",
        )
        require(
            cfg.algo.kl_tokens == "loss",
            "algo.kl_tokens",
            "policy_loss=mpo always anchors the reply's tokens other than the action; leave it at loss",
        )
        require(
            not cfg.algo.kl_in_reward, "algo.kl_in_reward", "policy_loss=mpo has no advantages to carry it"
        )

    def describe(self, cfg: RunConfig) -> str:
        return "mpo, all-action targets from a Q(s, a) state critic"

    def critic(self, cfg: RunConfig) -> str:
        return "state"

    def state_critic_outputs(self, num_actions: int) -> int:
        return num_actions

    def prepare(
        self, models: Any, batch: RolloutBatch, scores: Scores, cfg: RunConfig, stats: MetricAccumulator
    ) -> MpoPlan:
        turns = action_turns(batch, models.action_tokens, models.state_critic.reads)
        probs = rollout_policy(turns, scores.action_logp, len(models.action_tokens))  # (N, K)
        regression = sarsa_regression(turns, probs, cfg.algo.gamma)
        zeros = torch.zeros_like(batch.token_rewards)
        return MpoPlan(
            zeros, critic_inputs=turns.states, critic_regression=regression, turns=turns, probs=probs
        )

    def finish(self, models: Any, plan: MpoPlan, cfg: RunConfig, stats: MetricAccumulator) -> Plan:
        turns, probs = plan.turns, plan.probs
        with torch.no_grad():
            q = models.state_critic(turns.states).float() if turns.states else probs.new_zeros(probs.shape)
        stats.add("critic/q_mean", q.mean().item() if len(q) else 0.0, len(q))
        stats.add("train/acting_turn_share", len(turns.acted) / max(len(turns.states), 1), len(turns.states))
        targets, advantages = improved_policy(
            plan.advantages.shape,
            turns,
            probs,
            q.to(probs.device),
            cfg.algo.mpo_eta,
            cfg.algo.mpo_uniform_mix,
        )
        return Plan(advantages, targets=targets)

    def policy_units(self, batch: RolloutBatch, plan: Plan, cfg: RunConfig) -> Tensor:
        return action_target_mask(plan.targets).sum(dim=1)

    def loss(
        self,
        mb: MicroBatch,
        logp: Tensor,
        action_logp: Tensor | None,
        cfg: RunConfig,
        stats: MetricAccumulator,
    ) -> tuple[Tensor, Tensor]:
        mask = mb.part.loss_mask
        acting = action_target_mask(mb.targets)  # (b, l)
        acting_logp = action_logp[acting]  # (n, K): the acting turns' action-token log-probs
        loss = action_target_loss(acting_logp, mb.targets[acting], cfg.algo.mpo_mass_coef)
        stats.add("actor/mpo_loss", loss.item(), int(acting.sum()))
        action_mass = acting_logp.detach().logsumexp(dim=-1).exp()  # the reply format's hold
        stats.add(
            "actor/action_mass",
            action_mass.mean().item() if action_mass.numel() else 1.0,
            action_mass.numel(),
        )
        log_ratio = torch.where(mask, logp - mb.scores.old_logp, 0.0).detach()  # k3 estimate, as PPO's stats
        stats.add(
            "actor/approx_kl", masked_mean(log_ratio.exp() - 1 - log_ratio, mask).item(), mask.sum().item()
        )
        # the KL anchor holds the reply's other tokens (its format); the action is the target's to set
        return loss, mask & ~acting
