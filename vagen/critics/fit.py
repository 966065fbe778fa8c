"""Fitting the critics on a rollout batch.

State critics (vagen.critics.state): a TurnCritic reads one input per turn (the TurnRecord field its
`reads` names) and predicts V(s_t) (one output) or Q(s_t, .) (one output per action, the mpo update).
Scoring broadcasts V(s_t) onto the turn's tokens (`state_values`); once per iteration, before the
actor's update, the critic regresses onto the targets its policy update names, on every rank
(`fit_state_critic`): the estimator's returns (`return_regression`) or, for mpo, expected-SARSA
targets (vagen.updates.mpo.sarsa_regression).

The model critic (a value head on the policy's backbone, vagen.models.loading.ValueModel) is trained
with the policy, micro-batch by micro-batch, on PPO's clipped value loss (`model_critic_loss`).
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from vagen.algo import broadcast_turns, gather_turns, value_loss
from vagen.critics.state import TurnCritic
from vagen.distributed import comm_device, global_sum
from vagen.metrics import MetricAccumulator, add_value_moments
from vagen.models.scoring import token_values
from vagen.rollout.batch import RolloutBatch


def turn_states(batch: RolloutBatch, reads: str = "state") -> tuple[list, torch.Tensor]:
    """Every turn's critic input (its TurnRecord field `reads`: the env text grid, `state`, or the
    one-hot state vector, `features`), episodes in order, and the packed view's turn ends (E, L') bool."""
    turn_end = batch.view.gather(batch.turn_end).bool()
    counts = turn_end.sum(dim=1).tolist()
    if counts != [len(ep.turns) for ep in batch.episodes]:
        raise RuntimeError(
            f"turn ends per episode {counts} != recorded turns {[len(ep.turns) for ep in batch.episodes]}"
        )
    return [getattr(turn, reads) for episode in batch.episodes for turn in episode.turns], turn_end


def state_values(critic: TurnCritic, batch: RolloutBatch) -> torch.Tensor:
    """(B, L): V(s_t) of the state-critic on every adv-masked token of turn t."""
    states, turn_end = turn_states(batch, critic.reads)
    flat = critic(states).float()
    _, valid = gather_turns(turn_end.float(), turn_end)  # (E, T): a prefix of each row marks its turns
    per_turn = torch.zeros(valid.shape, dtype=flat.dtype, device=flat.device)
    per_turn[valid.to(flat.device)] = flat  # row-major: episodes in order, turns in order
    packed = broadcast_turns(per_turn, turn_end, batch.view.mask)
    return batch.view.scatter(packed, like=batch.token_rewards)


def return_regression(
    batch: RolloutBatch, returns: torch.Tensor, reads: str
) -> tuple[list, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]:
    """The V-critic's regression: every turn's critic input (TurnRecord field `reads`), and
    (V(s_t), R_t) given the critic's values, R_t the estimator's return at the turn's end."""
    if not len(batch):  # the filter may leave a rank without episodes; it still joins every reduction
        return [], lambda values: (values, values.new_zeros(0))
    states, turn_end = turn_states(batch, reads)
    per_turn, valid = gather_turns(batch.view.gather(returns), turn_end)
    targets = per_turn[valid].float().to(comm_device())
    return states, lambda values: (values, targets)


def fit_state_critic(
    critic: TurnCritic,
    optim: torch.optim.Optimizer,
    states: list,
    regression: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    stats: MetricAccumulator,
) -> None:
    """`steps` full-batch steps of 0.5 (prediction - target)^2 on every rank, where
    `regression` maps the critic's outputs on `states` ((N,) V, or (N, K) Q) to (predictions, targets).

    Gradients are summed over ranks (named reduction), divided by the global count of predictions, so
    every rank applies the same step.
    """
    ids = critic.encode(states)  # the byte loop once, not once per step
    count = None
    for step in range(steps):
        optim.zero_grad()
        predicted, targets = regression(critic.values(ids))
        if step == 0:  # the values the advantages used (the critic has not moved since scoring)
            before, first_targets = predicted.detach(), targets
            count = max(global_sum(len(targets)), 1.0)
        loss = 0.5 * (predicted - targets).pow(2).sum() / count
        loss.backward()
        for p in critic.parameters():
            dist.all_reduce(p.grad)  # named reduction: SUM of each rank's share of the mean loss
        optim.step()
    stats.add(
        "critic/vf_loss",
        0.5 * (before - first_targets).pow(2).mean().item() if len(before) else 0.0,
        len(before),
    )
    ones = torch.ones_like(first_targets, dtype=torch.bool)
    add_value_moments(stats, before, first_targets, ones)  # explained variance before this fit


def model_critic_loss(
    critic: torch.nn.Module, mb: Any, vf_clip: float, stats: MetricAccumulator
) -> torch.Tensor:
    """PPO's clipped value loss of the model critic on one micro-batch (vagen.batching.MicroBatch) over
    its adv-masked tokens, weighted for accumulation; a zero-weight pass for a padding micro-batch."""
    part = mb.part
    values = token_values(critic, part.input_ids, part.attention_mask, part.vision, len(part))
    if mb.scores is None:
        return 0.0 * values.sum()
    mask = part.adv_mask
    loss, vf = value_loss(values, mb.scores.values, mb.returns, mask, vf_clip)
    stats.add("critic/vf_loss", loss.item(), mask.sum().item())
    stats.add("critic/clipfrac", vf.clip_frac.item(), mask.sum().item())
    add_value_moments(stats, values.detach(), mb.returns, mask)
    return loss * mb.value_weight
