"""The update's batch plan (vagen.batching): derived sizes, micro-batch packing and the loss weights."""

import pytest
import torch
from test_rollout_batch import synthetic_batch  # a sibling test module

from vagen.batching import MiniBatchTotals, derived_sizes, local_totals, micro_batches, plan_micro_batches
from vagen.config import ConfigError, load_config
from vagen.models.scoring import Scores


def test_derived_sizes_split_groups_over_ranks_and_count_micro_batches():
    cfg = load_config(None, ["rollout.num_groups=4", "rollout.group_size=3", "algo.mini_batches=2"])
    cfg.trainer.micro_batch_size = 2
    sizes = derived_sizes(cfg, world_size=2)
    # 2 groups x 3 = 6 rows per rank; 3 rows per mini-batch -> 2 micro-batches of <= 2 rows
    assert (sizes.groups_per_rank, sizes.rows_per_rank, sizes.micro_batches_per_step) == (2, 6, 2)
    assert sizes.optimizer_steps_per_iteration == 2
    cfg.rollout.window, cfg.rollout.max_turns = 0, 5  # an episode spans up to 5 rows
    assert derived_sizes(cfg, world_size=2).rows_per_rank == 30
    with pytest.raises(ConfigError, match="do not split over 3 ranks"):
        derived_sizes(cfg, world_size=3)


def test_micro_batches_bucket_by_length_with_least_padding_and_a_fixed_count():
    lengths = torch.tensor([5, 9, 2, 7, 3])
    # rows 0, 2, 3, 4 have lengths 5, 2, 7, 3: {7} {5} {3, 2} pads 1 slot ({7, 5} {3, 2} would pad 3)
    parts = micro_batches(torch.tensor([0, 2, 3, 4]), lengths, size=2, count=3)
    assert [p.tolist() for p in parts] == [[3], [0], [4, 2]]
    parts = micro_batches(torch.tensor([0, 2]), lengths, size=2, count=3)  # fewer rows than passes
    assert [p.tolist() for p in parts] == [[0], [2], []]
    assert [p.tolist() for p in micro_batches(torch.tensor([], dtype=torch.long), lengths, 2, 2)] == [[], []]
    # three length classes, 12 rows, 3 passes of <= 4 rows: each class gets its own pass, no padding
    classes = torch.tensor([30, 10, 20] * 4)
    parts = micro_batches(torch.arange(12), classes, size=4, count=3)
    assert [sorted(set(classes[p].tolist())) for p in parts] == [[30], [20], [10]]
    with pytest.raises(RuntimeError, match="more than 1 micro-batches"):
        micro_batches(torch.tensor([0, 1, 2]), lengths, size=2, count=1)


def test_plan_weights_each_micro_batch_by_its_share_of_the_units_over_all_ranks():
    # 4 rows of lengths 4, 2, 3, 1 (attention); loss tokens 3, 1, 2, 1; adv tokens the same
    lengths = torch.tensor([4, 2, 3, 1])
    attention = (torch.arange(4)[None, :] < lengths[:, None]).long()
    loss_mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    turn_end = torch.zeros(4, 4, dtype=torch.bool)
    turn_end[torch.arange(4), lengths - 1] = True
    batch = synthetic_batch(loss_mask | turn_end, turn_end, torch.arange(4), torch.zeros(4, dtype=torch.long))
    batch.attention_mask, batch.loss_mask, batch.adv_mask = attention, loss_mask, loss_mask
    scores = Scores(torch.zeros(4, 4), torch.zeros(4, 4), None, None)
    units = loss_mask.sum(dim=1)  # token-mean
    mini = torch.tensor([0, 1, 2, 3])
    assert local_totals(batch, mini, units) == [7.0, 7.0, 7.0]
    # as if a second rank held as many units again: each micro-batch weighs its share of 14
    totals = MiniBatchTotals(14.0, 14.0, 14.0)
    adv = torch.arange(16.0).reshape(4, 4)
    plan = plan_micro_batches(batch, mini, scores, adv, None, None, units, totals, batch.select([0]), 2, 2, 2)
    assert [tuple(mb.part.input_ids.shape) for mb in plan] == [(2, 4), (2, 2)]  # rows {0, 2} and {1, 3}
    scale = 2 * 2  # world x accumulation
    expected = pytest.approx([scale * 5 / 14, scale * 2 / 14])  # rows {0, 2}: 3 + 2 units, {1, 3}: 1 + 1
    assert [mb.policy_weight for mb in plan] == expected
    assert [mb.token_weight for mb in plan] == expected and [mb.value_weight for mb in plan] == expected
    assert torch.equal(plan[1].adv, adv[[1, 3], :2])  # the rows' advantages, cut to their longest row
    padding = plan_micro_batches(
        batch, mini[:1], scores, adv, None, None, units, totals, batch.select([0]), 1, 2, 1
    )
    assert padding[1].scores is None and padding[1].policy_weight == 0.0  # a zero-weight pass
