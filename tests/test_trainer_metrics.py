"""Metric reduction and collapse alarms."""

import math

from vagen.config import AlarmConfig
from vagen.metrics import Alarms, MetricAccumulator


def test_accumulator_weights_items_not_calls():
    stats = MetricAccumulator()
    stats.add("train/success_rate", 1.0, weight=3)  # 3 episodes, all successful
    stats.add("train/success_rate", 0.0, weight=1)
    stats.add("critic/vf_loss", 5.0, weight=0)  # no tokens: contributes nothing
    stats.add_max("time/rollout_s", 2.0)
    stats.add_max("time/rollout_s", 1.0)
    reduced = stats.reduce()
    assert reduced == {"train/success_rate": 0.75, "critic/vf_loss": 0.0, "time/rollout_s": 2.0}


def test_alarms_fire_on_a_grad_norm_spike_and_a_sustained_std_drop():
    alarms = Alarms(
        AlarmConfig(window=10, spike_factor=3.0, drop_fraction=0.5, drop_patience=2, min_history=3)
    )
    fired = [alarms.update({"actor/grad_norm": 1.0, "train/return_std_in_group": 1.0}) for _ in range(4)]
    assert all(v == 0.0 for f in fired for v in f.values())
    assert alarms.update({"actor/grad_norm": 10.0})["alarm/grad_norm_spike"] == 1.0
    assert alarms.update({"actor/grad_norm": math.nan})["alarm/grad_norm_spike"] == 1.0
    assert alarms.update({"train/return_std_in_group": 0.1})["alarm/return_std_collapse"] == 0.0  # 1 step
    assert alarms.update({"train/return_std_in_group": 0.1})["alarm/return_std_collapse"] == 1.0  # patience 2
    assert set(alarms.update({})) == set()  # metrics absent this step: nothing to judge
