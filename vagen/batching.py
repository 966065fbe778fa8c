"""The update's batch plan: mini-batches of a rollout, each packed into micro-batches with loss weights.

Pure functions (no model, no collective): the trainer passes in the sums over all ranks. The sizes that
follow from the config and the world size are computed once, in `derived_sizes`.

Loss normalisation across micro-batches and ranks: DeepSpeed divides each backward by the accumulation
count and averages gradients over ranks, so a micro-batch's loss is multiplied by
world * accumulation * (its share of the mini-batch's units over all ranks): the applied gradient is
that of the mini-batch loss over all ranks' data, as in one process. The units of the policy loss are
the policy update's (`PolicyUpdate.policy_units`: loss tokens, rows, or action tokens); those of the
token-mean terms (entropy, KL) are the loss-masked tokens and those of the value loss the adv-masked
tokens. A padding micro-batch (no rows left on this rank) has weight 0.
"""

import math
from dataclasses import dataclass

import torch

from vagen.config import ConfigError, RunConfig
from vagen.models.scoring import Scores
from vagen.rollout.batch import RolloutBatch


@dataclass
class DerivedSizes:
    """Batch shapes computed once from the config and the world size, printed at start-up."""

    world_size: int
    groups_per_rank: int  # G / world: each rank rolls out its own share of the groups
    rows_per_rank: int  # groups_per_rank * n (one row per episode without a window)
    optimizer_steps_per_iteration: int  # ppo_epochs * mini_batches, whatever the filter keeps
    micro_batches_per_step: int  # gradient accumulation steps, equal on every rank

    def describe(self) -> str:
        return (
            f"world {self.world_size}: {self.groups_per_rank} groups = {self.rows_per_rank} rows per rank, "
            f"{self.optimizer_steps_per_iteration} optimizer steps per iteration, "
            f"{self.micro_batches_per_step} micro-batches per step"
        )


def derived_sizes(cfg: RunConfig, world_size: int) -> DerivedSizes:
    """Per-rank shares and the gradient-accumulation count that keeps every rank in lock-step.

    A mini-batch of one rank holds at most ceil(rows_per_rank / mini_batches) rows (fewer after the
    filter), so ceil(that / micro_batch_size) micro-batches always suffice; ranks with fewer rows pad
    with zero-weight micro-batches.
    """
    groups = cfg.rollout.num_groups
    if groups % world_size:
        raise ConfigError(
            f"bad value for config key 'rollout.num_groups': {groups} groups do not split over "
            f"{world_size} ranks"
        )
    rows = groups // world_size * cfg.rollout.group_size
    if cfg.rollout.window is not None:  # with a context window an episode spans up to max_turns rows
        rows *= cfg.rollout.max_turns
    rows_per_mini_batch = math.ceil(rows / cfg.algo.mini_batches)
    return DerivedSizes(
        world_size=world_size,
        groups_per_rank=groups // world_size,
        rows_per_rank=rows,
        optimizer_steps_per_iteration=cfg.algo.ppo_epochs * cfg.algo.mini_batches,
        micro_batches_per_step=math.ceil(rows_per_mini_batch / cfg.trainer.micro_batch_size),
    )


@dataclass
class MicroBatch:
    """Rows of one forward/backward, trimmed to their longest row, with their loss weights."""

    part: RolloutBatch  # (b, l) rows
    scores: Scores | None  # None for a zero-weight padding pass
    adv: torch.Tensor | None  # (b, l)
    returns: torch.Tensor | None  # (b, l)
    targets: torch.Tensor | None  # (b, l, K): mpo's q(.|s) at the action tokens
    policy_units: torch.Tensor | None  # (b,) each row's units of the policy loss's mean
    policy_weight: float  # scale of the policy-loss term (module docstring)
    token_weight: float  # scale of the token-mean terms (entropy, KL) of the actor
    value_weight: float  # scale of the model critic's token-mean loss


@dataclass
class MiniBatchTotals:
    """Sums over one mini-batch's rows on ALL ranks: the denominators of the loss weights."""

    policy_units: float
    loss_tokens: float
    value_tokens: float


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int, count: int) -> list[torch.Tensor]:
    """Split a mini-batch's rows into exactly `count` micro-batches of at most `size` rows, padding least.

    Every rank runs `count` forward/backward passes anyway, so rows are spread over all of them:
    rows sorted by length (descending) are cut into <= `count` consecutive runs of <= `size` rows
    minimising the padded slots sum_runs (rows_in_run * longest_in_run - tokens_in_run), by dynamic
    programming over cut points (O(count * n * size)). Missing micro-batches are empty (the caller
    runs them with zero weight).
    """
    if len(rows) > count * size:
        raise RuntimeError(f"{len(rows)} rows need more than {count} micro-batches of {size}")
    ordered = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    sorted_lengths = lengths[ordered].tolist()
    n = len(ordered)
    prefix = [0]
    for length in sorted_lengths:
        prefix.append(prefix[-1] + length)

    def padding(i: int, j: int) -> int:  # rows i..j-1 in one micro-batch, the longest is row i
        return (j - i) * sorted_lengths[i] - (prefix[j] - prefix[i])

    # best[k][j]: least padding of the first j rows in k runs; cut[k][j]: where the last run starts
    best = [[math.inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        best[k][0] = 0
        for j in range(1, n + 1):
            for i in range(max(0, j - size), j):
                candidate = best[k - 1][i] + padding(i, j)
                if candidate < best[k][j]:
                    best[k][j], cut[k][j] = candidate, i
    parts, j, k = [], n, min(range(count + 1), key=lambda k: (best[k][n], k))
    while j > 0:
        parts.insert(0, ordered[cut[k][j] : j])
        j, k = cut[k][j], k - 1
    return parts + [ordered[:0]] * (count - len(parts))


def local_totals(batch: RolloutBatch, mini: torch.Tensor, policy_units: torch.Tensor) -> list[float]:
    """This rank's [policy units, loss tokens, value tokens] of the mini-batch rows `mini` (to be summed
    over ranks into a MiniBatchTotals)."""
    return [
        float(policy_units[mini].sum()),
        float(batch.loss_mask[mini].sum()),
        float(batch.adv_mask[mini].sum()),
    ]


def plan_micro_batches(
    batch: RolloutBatch,
    mini: torch.Tensor,
    scores: Scores,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    targets: torch.Tensor | None,
    policy_units: torch.Tensor,
    totals: MiniBatchTotals,
    pad_row: RolloutBatch,
    micro_batch_size: int,
    count: int,
    world_size: int,
) -> list[MicroBatch]:
    """The `count` micro-batches of the mini-batch whose rows (on this rank) are `mini`.

    advantages, returns (B, L), targets (B, L, K) and policy_units (B,) cover the whole batch; each
    micro-batch gets its rows, cut to their longest row, and its weights (module docstring).
    """
    scale = world_size * count
    lengths = batch.attention_mask.sum(dim=1).cpu()  # (B,)
    plan = []
    for rows in micro_batches(mini, lengths, micro_batch_size, count):
        if not len(rows):
            plan.append(MicroBatch(pad_row, None, None, None, None, None, 0.0, 0.0, 0.0))
            continue
        length = int(lengths[rows].max())
        part = batch.select(rows).trim(length)
        plan.append(
            MicroBatch(
                part=part,
                scores=scores.select(rows).trim(length),
                adv=advantages[rows, :length],
                returns=None if returns is None else returns[rows, :length],
                targets=None if targets is None else targets[rows, :length],
                policy_units=policy_units[rows],
                policy_weight=scale * (policy_units[rows].sum().item() / max(totals.policy_units, 1)),
                token_weight=scale * part.loss_mask.sum().item() / max(totals.loss_tokens, 1),
                value_weight=scale * part.adv_mask.sum().item() / max(totals.value_tokens, 1),
            )
        )
    return plan
