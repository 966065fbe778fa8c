"""Per-group statistics of one scalar per row: the shared step of GRPO, RLOO, GiGPO and the filters."""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class GroupStats:
    """Statistics of `values` (B,) per group, in float64 so that huge returns cannot overflow.

    Groups are ordered by ascending group id, so ties broken by group order are deterministic.
    """

    ids: Tensor  # (G,) unique group ids, ascending
    row_group: Tensor  # (B,) long: index into `ids` of each row's group
    counts: Tensor  # (G,) float64: members per group
    mean: Tensor  # (G,) float64
    std: Tensor  # (G,) float64: unbiased (n - 1) std; 0 for a group of one
    constant: Tensor  # (G,) bool: every member has exactly the same value (always true for one member)


def group_stats(values: Tensor, group_ids: Tensor) -> GroupStats:
    """Mean, unbiased std and constancy of `values` (B,) within each group of `group_ids` (B,)."""
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(
            f"values and group_ids must both be (B,); got {tuple(values.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    values = values.to(torch.float64)
    if not torch.isfinite(values).all():
        raise ValueError("values contain NaN or inf; group statistics need finite returns")
    ids, row_group = torch.unique(group_ids, sorted=True, return_inverse=True)
    num_groups = ids.numel()
    counts = torch.zeros(num_groups, dtype=torch.float64, device=values.device)
    counts.index_add_(0, row_group, torch.ones_like(values))
    sums = torch.zeros_like(counts).index_add_(0, row_group, values)
    mean = sums / counts
    squared_dev = (values - mean[row_group]) ** 2
    sum_squared_dev = torch.zeros_like(counts).index_add_(0, row_group, squared_dev)
    std = torch.sqrt(sum_squared_dev / (counts - 1).clamp(min=1))
    group_max = torch.full_like(counts, -torch.inf).scatter_reduce(0, row_group, values, "amax")
    group_min = torch.full_like(counts, torch.inf).scatter_reduce(0, row_group, values, "amin")
    constant = group_max == group_min
    std = torch.where(constant, 0.0, std)
    return GroupStats(ids=ids, row_group=row_group, counts=counts, mean=mean, std=std, constant=constant)
