"""StarPO-S group filters: which rows survive, worked out by hand."""

import pytest
import torch

from vagen.algo.filters import GROUP_FILTERS, keep_top_std_groups, keep_top_variance_share

# group 10: [1, 1, 1] std 0        rows 0-2
# group 3:  [0, 2]    std sqrt(2)  rows 3-4   variance 2
# group 7:  [0, 1, 2] std 1        rows 5-7   variance 1
# group 1:  [5, 5]    std 0        rows 8-9
# group 4:  [0, 4]    std sqrt(8)  rows 10-11 variance 8
# descending std: 4, 3, 7, then the zero-std tie 1, 10 broken by ascending group id
RETURNS = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 2.0, 5.0, 5.0, 0.0, 4.0])
GROUP_IDS = torch.tensor([10, 10, 10, 3, 3, 7, 7, 7, 1, 1, 4, 4])


@pytest.mark.parametrize(
    ("keep_fraction", "expected_rows"),
    [
        (0.01, [10, 11]),  # floor(0.05) -> at least one group
        (0.4, [3, 4, 10, 11]),  # 2 groups
        (0.8, [3, 4, 5, 6, 7, 8, 9, 10, 11]),  # 4 groups: the tie keeps group 1, not 10
        (1.0, list(range(12))),
    ],
)
def test_keep_top_std_groups(keep_fraction, expected_rows):
    kept = keep_top_std_groups(RETURNS, GROUP_IDS, keep_fraction)
    assert kept.dtype == torch.long
    assert kept.tolist() == expected_rows


@pytest.mark.parametrize(
    ("top_p", "expected_rows"),
    [
        (0.7, [10, 11]),  # 8/11 = 0.727 >= 0.7
        (0.9, [3, 4, 10, 11]),  # 10/11 = 0.909
        (0.95, [3, 4, 5, 6, 7, 10, 11]),  # 11/11
        (1.0, [3, 4, 5, 6, 7, 10, 11]),  # zero-variance groups add no share
    ],
)
def test_keep_top_variance_share(top_p, expected_rows):
    assert keep_top_variance_share(RETURNS, GROUP_IDS, top_p).tolist() == expected_rows


def test_filters_when_no_group_varies():
    returns, ids = torch.ones(4), torch.tensor([0, 0, 1, 1])
    assert keep_top_variance_share(returns, ids, 0.5).tolist() == [0, 1, 2, 3]
    assert keep_top_std_groups(torch.tensor([3.0]), torch.tensor([0]), 0.5).tolist() == [0]  # group of one


def test_filters_are_found_by_name_and_check_their_argument():
    assert GROUP_FILTERS["top_std_fraction"](RETURNS, GROUP_IDS, 0.4).tolist() == [3, 4, 10, 11]
    assert GROUP_FILTERS["top_p_variance"](RETURNS, GROUP_IDS, 0.7).tolist() == [10, 11]
    with pytest.raises(ValueError, match="keep_fraction"):
        keep_top_std_groups(RETURNS, GROUP_IDS, 0.0)
    with pytest.raises(ValueError, match="top_p"):
        keep_top_variance_share(RETURNS, GROUP_IDS, 1.5)
