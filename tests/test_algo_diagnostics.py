"""Collapse diagnostics: group std, entropy, template score and the spike/drop detector."""

import math

import pytest
import torch

from vagen.algo.diagnostics import (
    CollapseDetector,
    masked_entropy_mean,
    mean_group_return_std,
    template_score,
)


def test_mean_group_return_std_skips_groups_of_one():
    # [1, 2, 3]: std 1; [0, 4]: std sqrt(8); [5] alone is left out
    returns = torch.tensor([1.0, 2.0, 3.0, 0.0, 4.0, 5.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 2])
    assert mean_group_return_std(returns, ids).item() == pytest.approx((1 + math.sqrt(8)) / 2)
    assert mean_group_return_std(torch.tensor([1.0]), torch.tensor([0])).item() == 0.0


def test_masked_entropy_mean():
    entropy = torch.tensor([[1.0, 5.0, 2.0], [3.0, math.nan, 9.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]], dtype=torch.bool)
    assert masked_entropy_mean(entropy, mask).item() == pytest.approx(2.0)
    assert masked_entropy_mean(entropy, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


def test_template_score_hand_computed():
    texts = ["Go left now.", "go left now", "push the box up"]
    score = template_score(texts, ["a", "b", "a"], n=2)
    # bigrams: (go left) (left now) (now .) | (go left) (left now) | (push the) (the box) (box up)
    assert score.distinct_n == pytest.approx(6 / 8)
    # pairs across states: (0, 1) Jaccard 3/4 ("." only in text 0), (1, 2) Jaccard 0; (0, 2) share a state
    assert score.cross_state_overlap == pytest.approx((3 / 4 + 0) / 2)
    assert score.num_pairs == 2


def test_template_score_flags_input_agnostic_reasoning():
    varied = template_score(["box left of me", "target is above", "wall to the right"], [0, 1, 2])
    echo = template_score(["i will move toward the goal"] * 3, [0, 1, 2])
    assert echo.cross_state_overlap == 1.0 > varied.cross_state_overlap
    assert echo.distinct_n < varied.distinct_n
    empty = template_score([], [])
    assert (empty.distinct_n, empty.cross_state_overlap, empty.num_pairs) == (0.0, 0.0, 0)
    with pytest.raises(ValueError, match="state keys"):
        template_score(["a"], [])


def test_detector_spike():
    detector = CollapseDetector(window=4, spike_factor=3.0, min_history=3)
    flags = [detector.update(v).spike for v in [1.0, 1.0, 5.0, 1.0, 2.0, 7.0, 1.0]]
    # 5.0 comes with only 2 values known; 7.0 > 3 * median(1, 5, 1, 2) = 4.5
    assert flags == [False, False, False, False, False, True, False]
    assert detector.update(math.nan).spike and detector.update(math.inf).spike


def test_detector_sustained_drop():
    detector = CollapseDetector(drop_fraction=0.5, drop_patience=3)
    values = [10.0, 8.0, 4.0, 4.0, 4.0, 3.0, 6.0, 4.0]
    flags = [detector.update(v).drop for v in values]
    # below 5 (half the running max 10) on steps 3, 4, 5, 6; 6.0 resets the count
    assert flags == [False, False, False, False, True, True, False, False]


def test_detector_rejects_bad_settings():
    with pytest.raises(ValueError):
        CollapseDetector(window=0)
