"""The mpo update's plumbing between a RolloutBatch and vagen.algo.mpo (algo.policy_loss=mpo).

Every turn of the batch gets its env state, reward and whether the episode went on; the turns that
executed an action (and sampled it as one of the K action tokens) get the privileged critic's
Q(s, .), the rollout policy over the K actions read at that token, and the improved policy q(.|s)
that the actor loss fits there. The critic is refit on the same turns' expected-SARSA targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vagen.algo.mpo import candidate_probs, expected_sarsa_targets, mpo_targets
from vagen.rollout.batch import RolloutBatch


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


@dataclass
class MpoPlan:
    """What one iteration's mpo update needs: targets (B, L, K), q(.|s) at each acting turn's action token,
    0 elsewhere (rows sum to 1 or 0); advantages (B, L), Q(s, a) - V(s) of the action taken there (logs)."""

    targets: Tensor
    advantages: Tensor


@torch.no_grad()
def mpo_plan(
    shape: torch.Size, turns: ActionTurns, probs: Tensor, q: Tensor, eta: float, uniform_mix: float
) -> MpoPlan:
    """The improved policy at every action token of a (B, L) `shape` batch from Q(s_t, .) (N, K) and
    pi_old (N, K) (vagen.algo.mpo)."""
    device = q.device
    targets = torch.zeros((*shape, q.shape[-1]), device=device)
    targets[turns.rows, turns.cols] = mpo_targets(q[turns.acted], probs[turns.acted], eta, uniform_mix)
    values = (probs * q).sum(dim=-1)  # (N,)
    taken = q[turns.acted].gather(1, turns.actions[:, None].to(device)).squeeze(1)
    advantages = torch.zeros(shape, device=device)
    advantages[turns.rows, turns.cols] = taken - values[turns.acted]
    return MpoPlan(targets, advantages)


def action_target_mask(targets: Tensor) -> Tensor:
    """(B, L, K) targets -> (B, L) bool: the tokens that carry one (a distribution sums to 1)."""
    return targets.sum(dim=-1) > 0.5
