"""Policy and value losses, KL estimators and entropy, over (B, L) token tensors.

`mask` is the loss mask M^loss (B, L): positions outside it never affect a loss or a statistic,
even when they hold NaN or inf (they are replaced before any arithmetic, so no NaN gradient leaks
through `0 * inf`). Losses compute in float32 (float64 stays float64). Each loss returns a small
stats record of detached 0-dim tensors; `stats_to_floats` turns one into loggable floats.
Variants are looked up by name: LOSS_AGGREGATIONS, KL_ESTIMATORS.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import Tensor

MAX_LOG_RATIO = 20.0  # exp(20) ~ 4.9e8: keeps ratios finite when log-probs of a token drift far apart


def _float(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"expected tensors of one shape, got {shapes}")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x * mask) / sum(mask) over all entries; 0 for an empty mask (still attached to the graph)."""
    mask = mask.bool()
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def stats_to_floats(stats: object) -> dict[str, float]:
    """{field name: float} of a stats record of 0-dim tensors (one host sync per field)."""
    return {field.name: float(getattr(stats, field.name)) for field in dataclasses.fields(stats)}


def _token_mean(per_token: Tensor, mask: Tensor, units: Tensor | None = None) -> Tensor:
    """sum over all masked tokens / number of masked tokens: every token weighs the same."""
    return masked_mean(per_token, mask)


def _seq_mean_token_sum(per_token: Tensor, mask: Tensor, units: Tensor | None = None) -> Tensor:
    """mean over non-empty rows of the row's token sum: longer replies weigh more."""
    row_sums = torch.where(mask, per_token, 0.0).sum(dim=1)  # (B,)
    return masked_mean(row_sums, mask.any(dim=1))


def _seq_mean_token_mean(per_token: Tensor, mask: Tensor, units: Tensor | None = None) -> Tensor:
    """mean over non-empty rows of the row's token mean: every reply weighs the same."""
    row_means = torch.where(mask, per_token, 0.0).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B,)
    return masked_mean(row_means, mask.any(dim=1))


def _episode_mean(per_token: Tensor, mask: Tensor, units: Tensor) -> Tensor:
    """mean over episodes of each episode's token mean over all its rows: with u_b = n_b / N_e(b) the
    row's share of its episode's N_e loss tokens (`units`, (B,)), sum_b (u_b / n_b) sum_i l_bi / sum_b u_b,
    which over whole episodes is (1 / E) sum_e (1 / N_e) sum_{i in e} l_i: every episode weighs the same."""
    row_sums = torch.where(mask, per_token, 0.0).sum(dim=1)  # (B,)
    weights = units.to(row_sums.dtype) / mask.sum(dim=1).clamp(min=1)  # (B,): 1 / N_e(b), 0 on empty rows
    return (row_sums * weights).sum() / units.sum().clamp(min=1e-12)


def _token_units(mask: Tensor, episode_ids: Tensor) -> Tensor:
    return mask.sum(dim=1)


def _row_units(mask: Tensor, episode_ids: Tensor) -> Tensor:
    return mask.any(dim=1).long()


def _episode_share_units(mask: Tensor, episode_ids: Tensor) -> Tensor:
    row_tokens = mask.sum(dim=1).double()  # (B,)
    episode_tokens = torch.zeros(int(episode_ids.max()) + 1 if len(episode_ids) else 0, dtype=torch.float64)
    episode_tokens = episode_tokens.to(row_tokens.device).index_add(0, episode_ids, row_tokens)
    return row_tokens / episode_tokens[episode_ids].clamp(min=1)


@dataclass(frozen=True)
class LossAggregation:
    """A registry entry. `units(mask (B, L), episode_ids (B,)) -> (B,)`: what each row counts in the
    mean's denominator (its masked tokens, 1 if it has any, or its share of its episode's tokens);
    `reduce(per_token (B, L), mask (B, L), units (B,)) -> scalar`: the mean over the rows at hand. Split
    into micro-batches, each one's mean is weighted by its share of the units of the whole batch."""

    reduce: Callable[[Tensor, Tensor, Tensor], Tensor]
    units: Callable[[Tensor, Tensor], Tensor]


LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    "token-mean": LossAggregation(_token_mean, _token_units),
    "seq-mean-token-sum": LossAggregation(_seq_mean_token_sum, _row_units),
    "seq-mean-token-mean": LossAggregation(_seq_mean_token_mean, _row_units),
    "episode-mean": LossAggregation(_episode_mean, _episode_share_units),
}


@dataclass
class PolicyLossStats:
    """Detached 0-dim tensors over the masked tokens."""

    clip_frac_upper: Tensor  # A > 0 and ratio > 1 + clip_high (clipped, no gradient)
    clip_frac_lower: Tensor  # A < 0 and ratio < 1 - clip_low
    dual_clip_frac: Tensor  # A < 0 and the dual clip's bound -c * A was the loss
    approx_kl: Tensor  # mean of (ratio - 1) - log ratio: k3 estimate of KL(old || new)
    ratio_mean: Tensor
    ratio_min: Tensor  # 1 for an empty mask
    ratio_max: Tensor  # 1 for an empty mask


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    units: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO's clipped surrogate with asymmetric clipping (DAPO's clip-higher) and optional dual clip.

    Per token, with ratio rho = exp(logp - old_logp) (log ratio clamped to +-MAX_LOG_RATIO):
        l = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high)),
    and with dual clip c > 1 (arXiv:1912.09729), for A < 0: l = min(l, -c * A).
    Aggregated over M^loss by `agg`, one of LOSS_AGGREGATIONS, with the rows' `units` (B,) (default:
    each row its own episode).

    logp (B, L) carries the gradient; old_logp, advantages (B, L) are constants; mask (B, L) bool.
    Returns (scalar loss, PolicyLossStats).
    """
    _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    if agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; choose from {sorted(LOSS_AGGREGATIONS)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    mask = mask.bool()
    logp = torch.where(mask, _float(logp), 0.0)
    old_logp = torch.where(mask, _float(old_logp.detach()), 0.0)
    advantages = torch.where(mask, _float(advantages.detach()), 0.0)

    log_ratio = (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, L)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask)
    if dual_clip is not None:
        dual_bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (per_token > dual_bound)
        per_token = torch.where(dual_clipped, dual_bound, per_token)
    aggregation = LOSS_AGGREGATIONS[agg]
    if units is None:
        units = aggregation.units(mask, torch.arange(len(mask), device=mask.device))
    loss = aggregation.reduce(per_token, mask, units)

    with torch.no_grad():
        has_tokens = mask.any()
        stats = PolicyLossStats(
            clip_frac_upper=masked_mean(((advantages > 0) & (ratio > 1.0 + clip_high)).float(), mask),
            clip_frac_lower=masked_mean(((advantages < 0) & (ratio < 1.0 - clip_low)).float(), mask),
            dual_clip_frac=masked_mean(dual_clipped.float(), mask),
            approx_kl=masked_mean(ratio - 1.0 - log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
            ratio_min=torch.where(has_tokens, torch.where(mask, ratio, torch.inf).min(), 1.0),
            ratio_max=torch.where(has_tokens, torch.where(mask, ratio, -torch.inf).max(), 1.0),
        )
    return loss, stats


@dataclass
class ValueLossStats:
    """Detached 0-dim tensors over the masked tokens."""

    clip_frac: Tensor  # the clipped prediction gave the larger error
    explained_variance: Tensor  # 1 - Var[R - V] / Var[R]; 0 when Var[R] <= MIN_RETURN_VARIANCE
    values_mean: Tensor
    returns_mean: Tensor


# Below this Var[R] the explained variance is reported as 0: returns that are equal up to float
# rounding (e.g. a batch without any reward) gave values like -4.8e14 in the logs.
MIN_RETURN_VARIANCE = 1e-8


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.5
) -> tuple[Tensor, ValueLossStats]:
    """PPO's clipped value loss, token-mean over the mask.

        V_clip = V_old + clip(V - V_old, -clip, clip),   l = 0.5 * max((V - R)^2, (V_clip - R)^2);
    clip=None gives the plain 0.5 * (V - R)^2. Explained variance uses the current values V.

    values (B, L) carries the gradient; old_values, returns (B, L) constants; mask (B, L) bool.
    Returns (scalar loss, ValueLossStats).
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    mask = mask.bool()
    values = torch.where(mask, _float(values), 0.0)
    old_values = torch.where(mask, _float(old_values.detach()), 0.0)
    returns = torch.where(mask, _float(returns.detach()), 0.0)

    unclipped_error = (values - returns) ** 2
    if clip is None:
        per_token = 0.5 * unclipped_error
        clipped_wins = torch.zeros_like(mask)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (clipped_values - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
        clipped_wins = clipped_error > unclipped_error
    loss = masked_mean(per_token, mask)

    with torch.no_grad():
        returns_mean = masked_mean(returns, mask)
        returns_var = masked_mean((returns - returns_mean) ** 2, mask)
        residual = returns - values
        residual_var = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
        defined = returns_var > MIN_RETURN_VARIANCE  # float noise on equal returns is not variance
        explained = torch.where(defined, 1.0 - residual_var / returns_var.clamp(min=MIN_RETURN_VARIANCE), 0.0)
        stats = ValueLossStats(
            clip_frac=masked_mean(clipped_wins.float(), mask),
            explained_variance=explained,
            values_mean=masked_mean(values, mask),
            returns_mean=returns_mean,
        )
    return loss, stats


def _kl_k1(log_ratio: Tensor) -> Tensor:
    """k1 = log(p / p_ref): unbiased, high variance, can be negative."""
    return log_ratio


def _kl_k2(log_ratio: Tensor) -> Tensor:
    """k2 = 0.5 * log(p / p_ref)^2: biased, low variance, >= 0."""
    return 0.5 * log_ratio**2


def _kl_k3(log_ratio: Tensor) -> Tensor:
    """k3 = p_ref / p - 1 - log(p_ref / p): unbiased, low variance, >= 0 (Schulman, "Approximating KL")."""
    ref_over_policy = -log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(ref_over_policy) - 1.0 - ref_over_policy


def _kl_abs(log_ratio: Tensor) -> Tensor:
    """|log(p / p_ref)|."""
    return log_ratio.abs()


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
    "abs": _kl_abs,
}


def kl(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of the sampled tokens.

    kind: "k1" log r, "k2" 0.5 (log r)^2, "k3" 1/r - 1 + log r (low variance), "abs" |log r|,
    with log r = logp - ref_logp. Returns (B, L) float32; mask it yourself, as a reward penalty
    (-beta * kl) or as a loss term (masked_mean(kl, mask)).
    """
    _check_same_shape(logp=logp, ref_logp=ref_logp)
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose from {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](_float(logp) - _float(ref_logp))


def _entropy_of_rows(logits: Tensor) -> Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v for rows (N, V), in float32; -inf logits add 0."""
    z = _float(logits)
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * torch.where(probs > 0, z, 0.0)).sum(dim=-1)


def entropy_from_logits(logits: Tensor, chunk_size: int = 256) -> Tensor:
    """Entropy of softmax(logits) over the last dim, chunk by chunk: (..., V) -> (...) float32.

        H = logsumexp(z) - sum_v softmax(z)_v * z_v
    At most `chunk_size` rows of V are expanded at a time, so no second (B, L, V) tensor exists;
    with gradients, each chunk is recomputed in backward (activation checkpointing) instead of
    keeping its softmax.
    """
    rows = logits.reshape(-1, logits.shape[-1])  # (B*L, V)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    pieces = []
    for chunk in rows.split(chunk_size):
        if needs_grad:
            pieces.append(torch.utils.checkpoint.checkpoint(_entropy_of_rows, chunk, use_reentrant=False))
        else:
            pieces.append(_entropy_of_rows(chunk))
    entropy = torch.cat(pieces) if pieces else rows.new_zeros(0, dtype=torch.float32)
    return entropy.reshape(logits.shape[:-1])
