"""Held-out validation layouts: validation maps are pairwise distinct and never appear in training."""

import pytest

from vagen.rollout.config import EnvConfig
from vagen.rollout.manager import layout_probe
from vagen.rollout.seeds import SeedSchedule

FROZEN_LAKE = EnvConfig(env_id="envs_visual/FrozenLake-v0", env_kwargs={"size": 4})


def schedule(num_val_layouts=64):
    return SeedSchedule(0, 0, 10**6, layout_of=layout_probe(FROZEN_LAKE), num_val_layouts=num_val_layouts)


def test_no_training_level_shows_a_validation_layout():
    seeds, layout_of = schedule(), layout_probe(FROZEN_LAKE)
    val_levels = [s.level for s in seeds.validation(64, 1)]
    val_layouts = {layout_of(level) for level in val_levels}
    assert len(val_layouts) == 64 and val_levels[0] == 10**6  # distinct layouts, from the val range
    train_levels = [s.level for _ in range(25) for s in seeds.next_train(8, 2)[::2]]
    assert len(set(train_levels)) == 200 and max(train_levels) < 10**6
    assert not {layout_of(level) for level in train_levels} & val_layouts
    # 4x4 maps repeat a lot: the 64 held-out maps are common ones, so training skipped many seeds
    assert max(train_levels) >= len(train_levels) + 50
    assert [s.level for s in seeds.validation(3, 2)[::2]] == val_levels[:3]  # fixed every call
    with pytest.raises(ValueError, match="num_val_layouts"):
        seeds.validation(65, 1)


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
