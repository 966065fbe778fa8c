"""Metric reduction and collapse alarms."""

import math
from types import SimpleNamespace

import torch

from vagen.config import RunConfig
from vagen.metrics import (
    Alarms,
    MetricAccumulator,
    add_value_moments,
    scoring_metrics,
    with_explained_variance,
)


def test_accumulator_weights_items_not_calls():
    stats = MetricAccumulator()
    stats.add("train/success_rate", 1.0, weight=3)  # 3 episodes, all successful
    stats.add("train/success_rate", 0.0, weight=1)
    stats.add("critic/vf_loss", 5.0, weight=0)  # no tokens: contributes nothing
    stats.add_max("time/rollout_s", 2.0)
    stats.add_max("time/rollout_s", 1.0)
    stats.add_sum("rollout/env_errors", 2)  # a count: summed, not averaged
    stats.add_sum("rollout/env_errors", 1)
    reduced = stats.reduce()
    expected = {"train/success_rate": 0.75, "critic/vf_loss": 0.0, "time/rollout_s": 2.0}
    assert reduced == expected | {"rollout/env_errors": 3.0}


def test_explained_variance_is_over_the_whole_step_not_per_micro_batch():
    """Two micro-batches whose returns are constant inside each (0 and 10) and a critic that predicts
    them up to +-1: per micro-batch Var[R] = 0 (nothing to explain), over the step the critic explains
    1 - Var[R - V] / Var[R] = 1 - 1 / 25 = 0.96 of it. The padding token (mask 0) is ignored."""
    stats = MetricAccumulator()
    mask = torch.tensor([[True, True, False]])
    add_value_moments(stats, torch.tensor([[1.0, -1.0, 5.0]]), torch.zeros(1, 3), mask)
    add_value_moments(stats, torch.tensor([[9.0, 11.0, 5.0]]), torch.full((1, 3), 10.0), mask)
    stats.add("critic/vf_loss", 0.5, 4)
    metrics = with_explained_variance(stats.reduce())
    assert math.isclose(metrics["critic/explained_var"], 0.96)
    assert metrics["critic/returns_mean"] == 5.0 and "critic/residual_sq_mean" not in metrics
    assert with_explained_variance({"actor/entropy": 1.0}) == {"actor/entropy": 1.0}  # no critic
    flat = MetricAccumulator()
    add_value_moments(flat, torch.tensor([[1.0, 3.0]]), torch.full((1, 2), 2.0), torch.ones(1, 2).bool())
    assert with_explained_variance(flat.reduce())["critic/explained_var"] == 0.0  # Var[R] = 0


def test_alarms_fire_on_a_grad_norm_spike_and_a_sustained_std_drop():
    alarms = Alarms()  # spikes: 3x the running median after 5 steps; drops: below half the max for 5 steps
    fired = [alarms.update({"actor/grad_norm": 1.0, "train/return_std_in_group": 1.0}) for _ in range(6)]
    assert all(v == 0.0 for f in fired for v in f.values())
    assert alarms.update({"actor/grad_norm": 10.0})["alarm/grad_norm_spike"] == 1.0
    assert alarms.update({"actor/grad_norm": math.nan})["alarm/grad_norm_spike"] == 1.0
    drops = [alarms.update({"train/return_std_in_group": 0.1})["alarm/return_std_collapse"] for _ in range(5)]
    assert drops == [0.0, 0.0, 0.0, 0.0, 1.0]  # the fifth step below half the best
    assert set(alarms.update({})) == set()  # metrics absent this step: nothing to judge


def test_format_alarm_fires_when_well_formed_replies_stay_below_half_their_best():
    # GRPO on Sokoban at lr 1e-3: 0.99 well-formed, then 0.30, 0.15, 0.09 within three iterations
    alarms = Alarms()
    series = [0.0, 0.0, 0.99, 0.97, 0.30, 0.15, 0.09, 0.06, 0.05, 0.04]  # an untrained start (0) never fires
    fired = [alarms.update({"train/format_ok_rate": v})["alarm/format_collapse"] for v in series]
    assert fired == [0.0] * 8 + [1.0, 1.0]
    recovered = alarms.update({"train/format_ok_rate": 0.9})["alarm/format_collapse"]
    assert recovered == 0.0


def test_grounding_f1_is_logged_for_formats_with_an_observation_and_malformed_replies_count_zero():
    from types import SimpleNamespace

    from vagen.metrics import rollout_metrics
    from vagen.rollout.batch import EpisodeRecord, TurnRecord

    def turn(grounding, format_ok=True):
        return TurnRecord(
            "obs", None, "reply", "stop", 5, format_ok, ["Up"], 0, 0.0, 0.0, grounding, None, 0.0
        )

    episode = EpisodeRecord(group=0, member=0, level_seed=1, dynamics_seed=1, turns=[turn(1.0), turn(0.5)])
    episode2 = EpisodeRecord(group=0, member=1, level_seed=1, dynamics_seed=2, turns=[turn(None, False)])
    batch = SimpleNamespace(
        episodes=[episode, episode2],
        episode_outcomes=lambda: (
            torch.tensor([0, 0]),
            torch.tensor([0.0, 1.0]),
            torch.tensor([False, True]),
        ),
    )
    tokenizer = lambda text, add_special_tokens: SimpleNamespace(input_ids=text.split())  # noqa: E731
    with_observation = MetricAccumulator()
    rollout_metrics(batch, tokenizer, with_observation, ("observation", "reasoning"))
    reduced = with_observation.reduce()
    assert math.isclose(reduced["train/grounding_f1"], 0.5) and "train/worldmodel_f1" not in reduced
    free_think = MetricAccumulator()
    rollout_metrics(batch, tokenizer, free_think, ())
    assert "train/grounding_f1" not in free_think.reduce()


def test_logprob_gap_compares_the_engine_and_the_trainer_on_sampled_tokens_only():
    # loss tokens 1 and 2: |-1 - (-1.5)| = 0.5 and |-2 - (-1)| = 1; the prompt tokens' 5.0 gap is ignored
    batch = SimpleNamespace(
        loss_mask=torch.tensor([[False, True, True, False]]),
        rollout_logprobs=torch.tensor([[0.0, -1.0, -2.0, 0.0]]),
    )
    scores = SimpleNamespace(
        old_logp=torch.tensor([[5.0, -1.5, -1.0, 0.3]]), entropy=torch.zeros(1, 4), ref_logp=None
    )
    stats = MetricAccumulator()
    scoring_metrics(batch, scores, RunConfig(), stats)
    assert math.isclose(stats.reduce()["rollout/logprob_gap"], 0.75)
