"""Evaluation metrics: Wilson interval, pass@k, the summary of episode records, and evaluate()."""

import pytest

from vagen.rollout.batch import EpisodeRecord, TurnRecord
from vagen.rollout.evaluate import pass_at_k, summarize, wilson_interval


def test_wilson_interval_matches_hand_computed_values():
    # 8 of 10: p = 0.8, z = 1.96 -> (0.4902, 0.9433) (standard tables).
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(0, 20)[1] == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)


def record(
    level: int, success: bool, actions: list[list[str]], invalid: list[int], ok: list[bool], end: str = ""
) -> EpisodeRecord:
    turns = [
        TurnRecord("obs", None, "r", "stop", 3, f, a, n, 1.0, 0.0, None, None, 1.0)
        for a, n, f in zip(actions, invalid, ok, strict=True)
    ]
    return EpisodeRecord(
        0, 0, level, 0, turns=turns, episode_return=float(len(turns)), success=success, end_reason=end
    )


def test_summarize_counts_episodes_turns_and_actions():
    episodes = [
        record(1, True, [["Up"], ["Up", "Left"]], [0, 1], [True, False], "success"),
        record(1, False, [["Down"]], [0], [True], "failure"),
        record(2, False, [[], ["Up"], ["Up"]], [2, 0, 0], [False, True, True], "truncated"),
        record(2, False, [["Left"]], [0], [True], "truncated"),
    ]
    s = summarize(episodes)
    assert (s.num_episodes, s.success_rate, s.mean_turns, s.mean_return) == (4, 0.25, 7 / 4, 7 / 4)
    assert s.invalid_action_rate == pytest.approx(3 / 10)  # 7 executed + 3 invalid proposed
    assert s.format_error_rate == pytest.approx(2 / 7)
    assert (s.k, s.pass_at_1, s.pass_at_k) == (2, pytest.approx(0.25), pytest.approx(0.5))
    assert (s.success_ci_low, s.success_ci_high) == wilson_interval(1, 4)
    assert s.end_reasons == {"truncated": 0.5, "success": 0.25, "failure": 0.25}  # most first
    assert list(s.end_reasons) == ["truncated", "success", "failure"]
    assert s.metrics()["val/success_rate"] == 0.25 and s.metrics()["val/end/truncated"] == 0.5
    assert s.grounding_f1 is None and "val/grounding_f1" not in s.metrics()  # no <observation> asked
    with pytest.raises(ValueError):
        summarize([])


def test_summarize_averages_grounding_over_the_turns_that_have_it():
    episode = record(1, False, [["Up"], ["Down"], ["Left"]], [0, 0, 0], [True, True, False])
    for turn, score in zip(episode.turns, (1.0, 0.5, 0.0), strict=True):
        turn.grounding = score
    assert summarize([episode]).metrics()["val/grounding_f1"] == pytest.approx(0.5)
