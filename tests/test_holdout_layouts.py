"""Held-out validation layouts: split by a hash of the layout, so validation maps never appear in
training and both sides keep the generator's distribution of maps."""

import numpy as np
import pytest

from vagen.config import EnvConfig
from vagen.rollout.manager import layout_probe
from vagen.rollout.seeds import SeedSchedule, is_held_out

FROZEN_LAKE = EnvConfig(env_id="envs_visual/FrozenLake-v0", env_kwargs={"size": 4})


def schedule(share=0.2):
    return SeedSchedule(0, 0, 10**6, layout_of=layout_probe(FROZEN_LAKE), val_layout_share=share)


def test_no_training_level_shows_a_validation_layout():
    seeds, layout_of = schedule(), layout_probe(FROZEN_LAKE)
    val_levels = [s.level for s in seeds.validation(64, 1)]
    val_layouts = {layout_of(level) for level in val_levels}
    assert min(val_levels) >= 10**6 and all(is_held_out(layout, 0.2) for layout in val_layouts)
    train_levels = [s.level for _ in range(25) for s in seeds.next_train(8, 2)[::2]]
    assert len(set(train_levels)) == 200 and max(train_levels) < 10**6
    assert not {layout_of(level) for level in train_levels} & val_layouts
    assert [s.level for s in seeds.validation(3, 2)[::2]] == val_levels[:3]  # fixed every call
    assert [s.level for s in seeds.validation(80, 1)][:64] == val_levels  # asking for more extends it


def test_both_sides_keep_the_generators_distribution_of_maps():
    # Holding out the first layouts met would hold out the most frequent maps (few holes), which
    # training would then never see: the hash split keeps the mean number of holes on both sides.
    seeds, layout_of = schedule(), layout_probe(FROZEN_LAKE)
    train = [layout_of(s.level).count("H") for s in seeds.next_train(600, 1)]
    val = [layout_of(s.level).count("H") for s in seeds.validation(300, 1)]
    assert abs(np.mean(train) - np.mean(val)) < 0.25
    assert min(train) <= 1 and min(val) <= 1  # maps with at most one hole on both sides
    share = np.mean([is_held_out(f"layout {i}", 0.2) for i in range(5000)])
    assert 0.18 < share < 0.22


def test_training_stream_is_deterministic_and_resumable():
    first, second = schedule(), schedule()
    stream = [s.level for _ in range(6) for s in first.next_train(4, 1)]
    assert stream == [s.level for _ in range(6) for s in second.next_train(4, 1)]
    assert first.state_dict() == {"train_levels_used": 24}
    resumed = schedule()
    resumed.load_state_dict({"train_levels_used": 12})
    assert [s.level for _ in range(3) for s in resumed.next_train(4, 1)] == stream[12:]


def test_without_layouts_seeds_are_the_plain_ranges():
    seeds = SeedSchedule(0, 0, 100)
    assert [s.level for s in seeds.next_train(3, 1)] == [0, 1, 2]
    assert [s.level for s in seeds.validation(2, 1)] == [100, 101]


def test_share_outside_the_open_interval_is_refused():
    with pytest.raises(ValueError, match="val_layout_share must lie in"):
        schedule(share=1.0)


def test_an_env_without_layout_keys_splits_levels_by_seed_range(monkeypatch):
    from envs_visual.frozenlake.env import VisualFrozenLakeEnv
    from vagen.rollout.manager import seed_schedule
    from vagen.rollout.seeds import TRAIN_SEED_START, VAL_SEED_START

    original = VisualFrozenLakeEnv.__init__

    def without_layout_key(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self.layout_key

    monkeypatch.setattr(VisualFrozenLakeEnv, "__init__", without_layout_key)
    seeds = seed_schedule(FROZEN_LAKE, seed=0)
    assert seeds.layout_of is None
    assert [s.level for s in seeds.next_train(2, 1)] == [TRAIN_SEED_START, TRAIN_SEED_START + 1]
    assert [s.level for s in seeds.validation(2, 1)] == [VAL_SEED_START, VAL_SEED_START + 1]
