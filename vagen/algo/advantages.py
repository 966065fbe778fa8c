"""Advantage estimators over token sequences and groups of episodes.

Conventions shared by every function here:
- token tensors are (B, L); `mask` is the advantage mask M^adv. The recursions visit only masked
  positions, in order: values and rewards at other positions are ignored and their advantages are 0;
- `rewards` (B, L) holds each turn's reward at its turn-end token, plus per-token penalties (e.g. KL);
- `turn_end` (B, L) bool marks the last generated token e_t of each turn; every turn end must lie
  inside `mask`. A token's turn index is the number of turn ends strictly before it
  (`turn_index`), so the turn-end token belongs to its own turn; masked tokens after a row's last
  turn end belong to no complete turn and get advantage 0 from the turn-based estimators;
- returns are `advantages + values` on masked positions, 0 elsewhere;
- results are computed in float32 (float64 inputs stay float64) and returned in that dtype, so
  bf16/fp16 critics do not round the recursions.

Variants are looked up by name in ADVANTAGE_ESTIMATORS (see the end of the file).
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from vagen.algo.groups import group_stats


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _check_token_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"expected (B, L) tensors of one shape, got {shapes}")


def _check_turn_ends_masked(turn_end: Tensor, mask: Tensor) -> None:
    if (turn_end & ~mask).any():
        raise ValueError("a turn-end token lies outside the advantage mask; M^adv must contain every e_t")


def _compact(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Positions of the masked tokens of each row, moved to the front in order.

    Returns `index` (B, K) long, a prefix of a per-row permutation of 0..L-1 whose first
    mask[b].sum() entries are row b's masked positions in ascending order, and `valid` (B, K) bool
    marking those entries; K is the largest number of masked tokens in a row.
    """
    index = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices  # (B, L)
    counts = mask.sum(dim=1, keepdim=True)  # (B, 1)
    width = int(counts.max()) if mask.numel() else 0
    index = index[:, :width]  # (B, K)
    valid = torch.arange(width, device=mask.device) < counts  # (B, K)
    return index, valid


def _gae_scan(
    rewards: Tensor,
    values: Tensor,
    gamma: float,
    lam: float,
    anchor: Tensor | None = None,
    anchor_advantages: Tensor | None = None,
) -> Tensor:
    """Backward GAE over consecutive columns of compacted (B, K) tensors, zero-padded on the right.

    delta_k = r_k + gamma * V_{k+1} - V_k and A_k = delta_k + gamma * lam * A_{k+1}, except where
    `anchor` (B, K) is set: there A_k = anchor_advantages[k] (the recursion restarts from it).
    Zero padding past a row's last entry gives V = A = 0 after it.
    """
    advantages = torch.zeros_like(values)  # (B, K)
    next_value = values.new_zeros(values.shape[0])  # (B,)
    next_advantage = values.new_zeros(values.shape[0])  # (B,)
    for k in reversed(range(values.shape[1])):
        delta = rewards[:, k] + gamma * next_value - values[:, k]
        next_advantage = delta + gamma * lam * next_advantage
        if anchor is not None:
            next_advantage = torch.where(anchor[:, k], anchor_advantages[:, k], next_advantage)
        next_value = values[:, k]
        advantages[:, k] = next_advantage
    return advantages


def _scatter_compact(compact: Tensor, index: Tensor, valid: Tensor, like: Tensor) -> Tensor:
    """Inverse of gathering with `_compact`: (B, K) back to (B, L), 0 at unvisited positions."""
    out = torch.zeros_like(like)
    return out.scatter_(1, index, torch.where(valid, compact, 0.0))


def turn_index(turn_end: Tensor) -> Tensor:
    """(B, L) long: the turn each token belongs to = number of turn ends strictly before it.

    The turn-end token e_t itself has index t (0-based); tokens after the last turn end of row b get
    turn_end[b].sum(), one past its last turn.
    """
    turn_end = turn_end.to(torch.long)
    return torch.cumsum(turn_end, dim=1) - turn_end


def _after_last_turn(turn_end: Tensor) -> Tensor:
    """(B, L) bool: tokens after the last turn end of their row (they belong to no complete turn)."""
    return turn_index(turn_end) >= turn_end.sum(dim=1, keepdim=True)


def gather_turns(token_values: Tensor, turn_end: Tensor) -> tuple[Tensor, Tensor]:
    """Values at the turn ends, one column per turn.

    Returns `turn_values` (B, T), T = the most turns in a row, turn_values[b, t] = token_values[b, e_t],
    zero-padded; and `turn_mask` (B, T) bool, a prefix of each row marking its real turns.
    """
    _check_token_shapes(token_values=token_values, turn_end=turn_end)
    index, valid = _compact(turn_end.bool())
    turn_values = torch.where(valid, token_values.gather(1, index), 0)  # (B, T)
    return turn_values, valid


def broadcast_turns(turn_values: Tensor, turn_end: Tensor, mask: Tensor) -> Tensor:
    """Give every masked token the value of its turn: out[b, i] = turn_values[b, turn_index[b, i]].

    turn_values (B, T) with T >= the most turns in a row (e.g. from `gather_turns` or `gigpo`);
    turn_end, mask (B, L) bool. Returns (B, L), 0 outside `mask` and after a row's last turn end.
    """
    _check_token_shapes(turn_end=turn_end, mask=mask)
    turn_end, mask = turn_end.bool(), mask.bool()
    turns_per_row = turn_end.sum(dim=1, keepdim=True)  # (B, 1)
    if turn_values.dim() != 2 or turn_values.shape[0] != mask.shape[0]:
        raise ValueError(
            f"turn_values must be (B, T) with B = {mask.shape[0]}, got {tuple(turn_values.shape)}"
        )
    max_turns = int(turns_per_row.max()) if turns_per_row.numel() else 0
    if turn_values.shape[1] < max_turns:
        raise ValueError(f"turn_values has {turn_values.shape[1]} columns but a row has more turns")
    out = torch.zeros(mask.shape, dtype=turn_values.dtype, device=turn_values.device)
    if turn_values.shape[1] == 0:
        return out
    index = turn_index(turn_end)  # (B, L)
    in_turn = mask & ~_after_last_turn(turn_end)
    gathered = turn_values.gather(1, index.clamp(max=turn_values.shape[1] - 1))  # (B, L)
    return torch.where(in_turn, gathered, out)


def masked_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE over the masked positions of each row, in order (PPO's estimator with gaps skipped).

    For consecutive masked positions p < q of a row:
        delta_p = r_p + gamma * V(q) - V(p),    A_p = delta_p + gamma * lam * A_q,
    and after the last masked position V = 0, A = 0. Returns R_p = A_p + V(p).

    rewards, values (B, L) float; mask (B, L) bool. Returns (advantages, returns), both (B, L),
    0 outside the mask.
    """
    _check_token_shapes(rewards=rewards, values=values, mask=mask)
    dtype = _compute_dtype(rewards, values)
    mask = mask.bool()
    rewards = torch.where(mask, rewards.to(dtype), 0.0)  # (B, L)
    values = torch.where(mask, values.to(dtype), 0.0)  # (B, L)
    index, valid = _compact(mask)  # (B, K)
    compact_advantages = _gae_scan(rewards.gather(1, index), values.gather(1, index), gamma, lam)
    advantages = _scatter_compact(compact_advantages, index, valid, values)
    return advantages, torch.where(mask, advantages + values, 0.0)


def turn_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, turn_end: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE over turns only ("Turn-PPO"); each masked token of turn t gets its turn's A_t.

    With R_t = rewards[e_t] and V_t = values[e_t] (per-token rewards elsewhere are not used):
        delta_t = R_t + gamma * V_{t+1} - V_t,    A_t = delta_t + gamma * lam * A_{t+1},
        V_{T+1} = A_{T+1} = 0;
    A[i] = A_t for every masked token i of turn t; returns R[i] = A[i] + V(i).

    rewards, values (B, L) float; mask, turn_end (B, L) bool. Returns (advantages, returns), (B, L).
    """
    _check_token_shapes(rewards=rewards, values=values, mask=mask, turn_end=turn_end)
    mask, turn_end = mask.bool(), turn_end.bool()
    _check_turn_ends_masked(turn_end, mask)
    turn_end_advantages, _ = masked_gae(rewards, values, turn_end, gamma, lam)  # A_t at e_t
    per_turn, _ = gather_turns(turn_end_advantages, turn_end)  # (B, T)
    advantages = broadcast_turns(per_turn, turn_end, mask)  # (B, L)
    values = values.to(advantages.dtype)
    in_turn = mask & ~_after_last_turn(turn_end)
    return advantages, torch.where(in_turn, advantages + values, 0.0)


def bilevel_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    turn_end: Tensor,
    gamma_turn: float,
    lam_turn: float,
    gamma_token: float,
    lam_token: float,
) -> tuple[Tensor, Tensor]:
    """TRICO's bi-level GAE: cross-turn credit at the turn ends, then token credit within each turn.

    Turn level, backwards over the turn ends e_1..e_T with R_t = rewards[e_t]:
        delta_t = R_t + gamma_turn * V(e_{t+1}) - V(e_t),  A_t = delta_t + gamma_turn * lam_turn * A_{t+1},
        V(e_{T+1}) = A_{T+1} = 0.
    Token level, within turn t backwards from A(e_t) = A_t: an earlier masked token i whose next
    masked token in the same turn is i+ gets
        delta_i = r_i + gamma_token * V(i+) - V(i),     A_i = delta_i + gamma_token * lam_token * A(i+).
    Returns R[i] = A[i] + V(i). Separate lambdas for the two levels as in the TRICO paper (VAGEN's
    code shared one). Masked tokens after a row's last turn end get 0.

    rewards, values (B, L) float; mask, turn_end (B, L) bool. Returns (advantages, returns), (B, L).
    """
    _check_token_shapes(rewards=rewards, values=values, mask=mask, turn_end=turn_end)
    mask, turn_end = mask.bool(), turn_end.bool()
    _check_turn_ends_masked(turn_end, mask)
    turn_advantages, _ = masked_gae(rewards, values, turn_end, gamma_turn, lam_turn)  # A_t at e_t, else 0
    dtype = turn_advantages.dtype
    rewards = torch.where(mask, rewards.to(dtype), 0.0)  # (B, L)
    values = torch.where(mask, values.to(dtype), 0.0)  # (B, L)
    index, valid = _compact(mask)  # (B, K)
    compact_advantages = _gae_scan(
        rewards.gather(1, index),
        values.gather(1, index),
        gamma_token,
        lam_token,
        anchor=turn_end.gather(1, index) & valid,
        anchor_advantages=turn_advantages.gather(1, index),
    )
    advantages = _scatter_compact(compact_advantages, index, valid, values)
    after_last_turn = _after_last_turn(turn_end)  # (B, L)
    advantages = torch.where(after_last_turn, 0.0, advantages)
    return advantages, torch.where(mask & ~after_last_turn, advantages + values, 0.0)


def grpo(returns: Tensor, group_ids: Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    """GRPO's group-relative advantage of each episode (B,).

        A_b = (R_b - mean_g) / (std_g + eps)     (unbiased std over the group g of b)
    or A_b = R_b - mean_g when scale_by_std=False (the mean-centred variant, Dr. GRPO).
    A group of one, or one whose returns are all equal, gets 0.

    returns (B,) float (raw episode returns); group_ids (B,) integer. Returns (B,) float32.
    """
    stats = group_stats(returns, group_ids)
    centred = returns.to(torch.float64) - stats.mean[stats.row_group]
    advantages = centred / (stats.std[stats.row_group] + eps) if scale_by_std else centred
    advantages = torch.where(stats.constant[stats.row_group], 0.0, advantages)
    return advantages.to(torch.float32)


def rloo(returns: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantage (B,): each episode against the mean of the others of its group.

        A_b = R_b - (sum_{j in g, j != b} R_j) / (n_g - 1)  =  n_g / (n_g - 1) * (R_b - mean_g)
    A group of one gets 0. returns (B,) float; group_ids (B,) integer. Returns (B,) float32.
    """
    stats = group_stats(returns, group_ids)
    counts = stats.counts[stats.row_group]
    centred = returns.to(torch.float64) - stats.mean[stats.row_group]
    advantages = torch.where(counts > 1, counts / (counts - 1).clamp(min=1) * centred, 0.0)
    advantages = torch.where(stats.constant[stats.row_group], 0.0, advantages)
    return advantages.to(torch.float32)


def gigpo(
    step_rewards: Tensor,
    step_mask: Tensor,
    state_keys: list[list[Hashable]],
    group_ids: Tensor,
    gamma: float,
    step_weight: float = 1.0,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> Tensor:
    """GiGPO (verl-agent, arXiv:2505.10978): episode-level plus step-level group-relative advantages.

    Inputs, for B episodes of at most T steps (a step = a turn):
      step_rewards (B, T) float: reward of step t of episode b (e.g. `gather_turns(rewards, turn_end)`);
      step_mask (B, T) bool: real steps, a prefix of each row;
      state_keys: state_keys[b][t] is an exact, hashable key of the state episode b acted in at step t
          (e.g. the XSB text of the grid); len(state_keys[b]) == step_mask[b].sum();
      group_ids (B,) integer: episodes of one group start from the same initial state;
      gamma: discount of the step returns; step_weight: omega below.
    Episode level: A^E_b = grpo(sum_t r_{b,t}) within the episode group.
    Step level: G_{b,t} = sum_{k>=t} gamma^(k-t) r_{b,k}; the steps of one group taken in identical
    states form an anchor group, and A^S_{b,t} = grpo(G) within the anchor group (0 for a state seen
    only once; verl-agent leaves that step's return un-normalised instead).
    Returns (B, T) float32: A_{b,t} = A^E_b + omega * A^S_{b,t}, 0 outside step_mask. Spread them over
    tokens with `broadcast_turns(advantages, turn_end, mask)`.
    """
    if step_rewards.dim() != 2 or step_mask.shape != step_rewards.shape:
        shapes = (tuple(step_rewards.shape), tuple(step_mask.shape))
        raise ValueError(f"step_rewards and step_mask must be (B, T) of one shape; got {shapes}")
    step_mask = step_mask.bool()
    steps_per_row = step_mask.sum(dim=1)  # (B,)
    prefix = torch.arange(step_mask.shape[1], device=step_mask.device) < steps_per_row[:, None]
    if not torch.equal(prefix, step_mask):
        raise ValueError("step_mask must mark a prefix of each row (steps 0..n_b-1)")
    if [len(keys) for keys in state_keys] != steps_per_row.tolist():
        raise ValueError("state_keys must hold one key per real step of each episode")
    step_rewards = torch.where(step_mask, step_rewards.to(torch.float64), 0.0)  # (B, T)
    episode_advantages = grpo(step_rewards.sum(dim=1), group_ids, eps, scale_by_std)  # (B,)

    step_returns = torch.zeros_like(step_rewards)  # (B, T)
    running = step_rewards.new_zeros(step_rewards.shape[0])  # (B,)
    for t in reversed(range(step_rewards.shape[1])):
        running = step_rewards[:, t] + gamma * running
        step_returns[:, t] = running

    rows, cols = step_mask.nonzero(as_tuple=True)  # row-major: the order of state_keys flattened
    anchor_of: dict[tuple[int, Hashable], int] = {}
    row_groups = group_ids.tolist()
    anchor_ids = [
        anchor_of.setdefault((row_groups[b], key), len(anchor_of))
        for b, keys in enumerate(state_keys)
        for key in keys
    ]
    step_advantages = grpo(
        step_returns[rows, cols],
        torch.tensor(anchor_ids, dtype=torch.long, device=rows.device),
        eps,
        scale_by_std,
    )
    advantages = torch.zeros(step_rewards.shape, dtype=torch.float32, device=step_rewards.device)
    advantages[rows, cols] = episode_advantages[rows] + step_weight * step_advantages
    return advantages


def broadcast(seq_advantage: Tensor, mask: Tensor) -> Tensor:
    """One advantage per sequence (B,) onto its masked tokens: A[b, i] = seq_advantage[b] * mask[b, i].

    Returns (B, L) in the dtype of seq_advantage.
    """
    if seq_advantage.dim() != 1 or mask.dim() != 2 or mask.shape[0] != seq_advantage.shape[0]:
        raise ValueError(f"expected (B,) and (B, L); got {tuple(seq_advantage.shape)}, {tuple(mask.shape)}")
    return torch.where(mask.bool(), seq_advantage[:, None], 0.0).to(seq_advantage.dtype)


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Masked whitening: (x - mu) / sqrt(var + eps) with the mean and unbiased variance over masked entries.

    Computed in float64 (huge values cannot overflow), returned as float32 (float64 stays float64);
    0 outside the mask, all 0 for an empty mask.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values and mask shapes differ: {tuple(values.shape)} vs {tuple(mask.shape)}")
    mask = mask.bool()
    x = torch.where(mask, values.to(torch.float64), 0.0)
    count = mask.sum()
    mean = x.sum() / count.clamp(min=1)
    centred = torch.where(mask, x - mean, 0.0)
    var = (centred**2).sum() / (count - 1).clamp(min=1)
    return (centred / torch.sqrt(var + eps)).to(_compute_dtype(values))


@dataclass
class AdvantageInputs:
    """What an estimator may read about B trajectories of L tokens (filled from a RolloutBatch)."""

    rewards: Tensor  # (B, L) float: turn rewards at turn ends + per-token penalties
    mask: Tensor  # (B, L) bool: M^adv
    turn_end: Tensor  # (B, L) bool: last generated token of each turn
    group_ids: Tensor  # (B,) long: rows of one group share the initial state
    episode_returns: Tensor  # (B,) float: raw episode returns
    values: Tensor | None = None  # (B, L) float: critic values; needed when the estimator uses_critic
    state_keys: list[list[Hashable]] | None = None  # per row, one state key per turn; needed by gigpo


@dataclass
class AdvantageParams:
    """Hyper-parameters of the estimators (defaults: DESIGN.md)."""

    gamma: float = 1.0  # discount: per token (gae), per turn (turn_gae, bilevel_gae, gigpo's step returns)
    lam: float = 1.0  # GAE lambda: per token (gae), per turn (turn_gae, bilevel_gae)
    gamma_token: float = 1.0  # bilevel_gae: discount within a turn
    lam_token: float = 1.0  # bilevel_gae: lambda within a turn
    norm_eps: float = 1e-6  # grpo / gigpo: added to the group std
    scale_by_std: bool = True  # grpo / gigpo: divide by the group std (False: mean-centred only)
    step_weight: float = 1.0  # gigpo: weight omega of the step-level advantage


def _critic_values(inputs: AdvantageInputs, name: str) -> Tensor:
    if inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs critic values (inputs.values)")
    return inputs.values


def _gae(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    return masked_gae(inputs.rewards, _critic_values(inputs, "gae"), inputs.mask, p.gamma, p.lam)


def _turn_gae(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    values = _critic_values(inputs, "turn_gae")
    return turn_gae(inputs.rewards, values, inputs.mask, inputs.turn_end, p.gamma, p.lam)


def _bilevel_gae(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    values = _critic_values(inputs, "bilevel_gae")
    return bilevel_gae(
        inputs.rewards,
        values,
        inputs.mask,
        inputs.turn_end,
        p.gamma,
        p.lam,
        p.gamma_token,
        p.lam_token,
    )


def _grpo(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    return broadcast(
        grpo(inputs.episode_returns, inputs.group_ids, p.norm_eps, p.scale_by_std), inputs.mask
    ), None


def _rloo(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    return broadcast(rloo(inputs.episode_returns, inputs.group_ids), inputs.mask), None


def _gigpo(inputs: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    if inputs.state_keys is None:
        raise ValueError("advantage estimator 'gigpo' needs inputs.state_keys (one key per turn)")
    step_rewards, step_mask = gather_turns(inputs.rewards, inputs.turn_end)  # (B, T)
    per_step = gigpo(
        step_rewards,
        step_mask,
        inputs.state_keys,
        inputs.group_ids,
        p.gamma,
        p.step_weight,
        p.norm_eps,
        p.scale_by_std,
    )
    return broadcast_turns(per_step, inputs.turn_end, inputs.mask), None


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registry entry: `compute(inputs, params) -> (advantages (B, L), returns (B, L) or None)`."""

    compute: Callable[[AdvantageInputs, AdvantageParams], tuple[Tensor, Tensor | None]]
    uses_critic: bool  # True: needs inputs.values and yields returns for the value loss
    # default loss aggregation (LOSS_AGGREGATIONS): an advantage shared by a whole episode (or turn group)
    # is averaged per episode, or episodes that run out their turns would outweigh short successes
    aggregation: str = "token-mean"


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(_gae, uses_critic=True),
    "turn_gae": AdvantageEstimator(_turn_gae, uses_critic=True),
    "bilevel_gae": AdvantageEstimator(_bilevel_gae, uses_critic=True),
    "grpo": AdvantageEstimator(_grpo, uses_critic=False, aggregation="episode-mean"),
    "rloo": AdvantageEstimator(_rloo, uses_critic=False, aggregation="episode-mean"),
    "gigpo": AdvantageEstimator(_gigpo, uses_critic=False, aggregation="episode-mean"),
}
