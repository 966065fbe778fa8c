"""StarPO-S rollout filters: keep the whole groups whose returns vary the most (RAGEN, arXiv:2504.20073).

A group whose members all earn the same return teaches a group-relative estimator nothing, and
low in-group variance is the first sign of collapse; training on the most uncertain groups is what
StarPO-S does. Filters rank groups by the std / variance of their RAW episode returns (never of
normalised advantages, which are ~1 in every group by construction) and return the kept ROW
indices (K,) long, ascending, always whole groups.

Ties are broken by ascending group id, so the same inputs always keep the same rows.

How the trainer uses the result: it keeps the number of optimizer steps per iteration fixed and
lets the mini-batch size adapt (kept rows / steps), so a strict filter changes how much data each
step sees, not how many steps (and how far) the policy moves per iteration.

Filters are looked up by name in GROUP_FILTERS: `fn(returns, group_ids, amount)`.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from vagen.algo.groups import GroupStats, group_stats


def _rows_of_groups(stats: GroupStats, kept_groups: Tensor) -> Tensor:
    """Ascending row indices (K,) of the rows whose group index is in kept_groups."""
    keep = torch.zeros(stats.ids.numel(), dtype=torch.bool, device=stats.ids.device)
    keep[kept_groups] = True
    return torch.nonzero(keep[stats.row_group]).flatten()


def _groups_by_std(stats: GroupStats) -> Tensor:
    """Group indices sorted by descending std (ties: ascending group id)."""
    return torch.sort(stats.std, descending=True, stable=True).indices


def keep_top_std_groups(returns: Tensor, group_ids: Tensor, keep_fraction: float) -> Tensor:
    """Rows of the floor(keep_fraction * G) groups (at least one) with the largest return std.

    returns (B,) raw episode returns; group_ids (B,) integer; 0 < keep_fraction <= 1.
    Returns kept row indices (K,) long, ascending.
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    stats = group_stats(returns, group_ids)
    num_keep = max(1, int(keep_fraction * stats.ids.numel() + 1e-9))
    return _rows_of_groups(stats, _groups_by_std(stats)[:num_keep])


def keep_top_variance_share(returns: Tensor, group_ids: Tensor, top_p: float) -> Tensor:
    """Rows of the highest-variance groups, taken until their share of the total variance reaches top_p.

    With var_g the unbiased return variance of group g, sorted descending: keep the smallest k with
        sum_{j<=k} var_(j) >= top_p * sum_g var_g.
    If every group has zero variance there is nothing to rank: all groups are kept.
    returns (B,); group_ids (B,) integer; 0 < top_p <= 1.
    Returns kept row indices (K,) long, ascending.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    stats = group_stats(returns, group_ids)
    order = _groups_by_std(stats)
    cumulative = torch.cumsum(stats.std[order] ** 2, dim=0)  # (G',)
    if cumulative.numel() == 0 or cumulative[-1] == 0:
        return _rows_of_groups(stats, order)
    cumulative_share = cumulative / cumulative[-1]
    num_keep = int((cumulative_share < top_p - 1e-12).sum()) + 1
    return _rows_of_groups(stats, order[:num_keep])


GROUP_FILTERS: dict[str, Callable[[Tensor, Tensor, float], Tensor]] = {
    "top_std_fraction": keep_top_std_groups,
    "top_p_variance": keep_top_variance_share,
}
