"""RolloutBatch bookkeeping: the per-episode packed view (advantages across window segments), select, to."""

import torch

from vagen.algo.advantages import bilevel_gae, masked_gae
from vagen.models.vision import VisionInputs
from vagen.rollout.batch import EpisodeRecord, RolloutBatch


def synthetic_batch(adv_mask, turn_end, episode_ids, segment_ids, images_per_row=None, vision=None):
    rows, length = adv_mask.shape
    generator = torch.Generator().manual_seed(0)
    rewards = torch.where(turn_end, torch.randn(rows, length, generator=generator), 0.0)
    num_episodes = int(episode_ids.max()) + 1
    return RolloutBatch(
        input_ids=torch.arange(rows * length).reshape(rows, length),
        attention_mask=torch.ones(rows, length, dtype=torch.long),
        vision=vision,
        images_per_row=images_per_row if images_per_row is not None else torch.zeros(rows, dtype=torch.long),
        loss_mask=adv_mask.clone(),
        adv_mask=adv_mask,
        turn_end=turn_end,
        token_rewards=rewards,
        rollout_logprobs=torch.zeros(rows, length),
        token_turn=torch.full((rows, length), -1),
        action_token=torch.zeros(rows, length, dtype=torch.bool),
        group_ids=episode_ids // 2,
        episode_ids=episode_ids,
        segment_ids=segment_ids,
        episode_returns=torch.zeros(rows),
        success=torch.zeros(rows, dtype=torch.bool),
        episodes=[EpisodeRecord(e // 2, e % 2, e // 2, e) for e in range(num_episodes)],
    )


def random_turns(rows: int, length: int, seed: int):
    """Random adv masks with turns: runs of masked tokens, each ending in a turn end."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) < 0.6
    turn_end = mask & (torch.rand(rows, length, generator=generator) < 0.3)
    last = length - 1 - torch.flip(mask.int(), [1]).argmax(1)  # last masked column per row
    turn_end[torch.arange(rows), last] = True
    return mask, turn_end


def run_bilevel(rewards, values, mask, turn_end):
    return bilevel_gae(
        rewards, values, mask, turn_end, gamma_turn=0.9, lam_turn=0.8, gamma_token=0.95, lam_token=0.7
    )[0]


def test_packed_view_equals_rows_with_one_row_per_episode():
    mask, turn_end = random_turns(4, 12, seed=1)
    batch = synthetic_batch(mask, turn_end, torch.arange(4), torch.zeros(4, dtype=torch.long))
    values = torch.randn(4, 12, generator=torch.Generator().manual_seed(2))
    direct = run_bilevel(batch.token_rewards, values, mask, turn_end)
    view = batch.view
    packed = run_bilevel(
        view.gather(batch.token_rewards), view.gather(values), view.mask, view.gather(turn_end)
    )
    through_view = view.scatter(packed, like=values)
    assert torch.allclose(through_view[mask], direct[mask], atol=1e-6)
    assert (through_view[~mask] == 0).all()
    direct_gae = masked_gae(batch.token_rewards, values, mask, 0.9, 0.8)[0]
    packed_gae = masked_gae(view.gather(batch.token_rewards), view.gather(values), view.mask, 0.9, 0.8)[0]
    assert torch.allclose(view.scatter(packed_gae, like=values)[mask], direct_gae[mask], atol=1e-6)


def test_packed_view_joins_segments_of_an_episode_in_turn_order():
    # Episode 0 was split into two rows (listed second-segment first); episode 1 has one row.
    mask, turn_end = random_turns(3, 10, seed=3)
    batch = synthetic_batch(mask, turn_end, torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]))
    values = torch.randn(3, 10, generator=torch.Generator().manual_seed(4))
    view = batch.view
    assert view.mask.sum(1).tolist() == [mask[0].sum() + mask[2].sum(), mask[1].sum()]
    packed = run_bilevel(
        view.gather(batch.token_rewards), view.gather(values), view.mask, view.gather(turn_end)
    )
    result = view.scatter(packed, like=values)
    # Reference: episode 0 as one long row = segment 0 (row 2) then segment 1 (row 0).
    joined = [torch.cat([x[2], x[0]]).unsqueeze(0) for x in (batch.token_rewards, values, mask, turn_end)]
    reference = run_bilevel(*joined)[0]
    assert torch.allclose(
        torch.cat([result[2][mask[2]], result[0][mask[0]]]), reference[joined[2][0]], atol=1e-6
    )
    # Credit flows across the segment boundary: the first segment's advantages see the second's rewards.
    alone = run_bilevel(batch.token_rewards[2:3], values[2:3], mask[2:3], turn_end[2:3])
    assert not torch.allclose(alone[0][mask[2]], result[2][mask[2]])


def test_select_keeps_images_with_their_rows_and_to_moves_everything():
    mask, turn_end = random_turns(3, 6, seed=5)
    grid = torch.tensor([[1, 2, 2], [1, 2, 4], [1, 4, 4], [1, 2, 2]])  # 4, 8, 16, 4 patches
    pixels = torch.cat([torch.full((int(n), 3), float(i)) for i, n in enumerate(grid.prod(-1))])
    vision = VisionInputs(pixels, grid)
    batch = synthetic_batch(
        mask,
        turn_end,
        torch.tensor([0, 1, 2]),
        torch.zeros(3, dtype=torch.long),
        images_per_row=torch.tensor([1, 0, 3]),
        vision=vision,
    )
    picked = batch.select([2, 0])
    assert picked.images_per_row.tolist() == [3, 1]
    assert torch.equal(picked.vision.image_grid_thw, grid[[1, 2, 3, 0]])
    assert picked.vision.pixel_values[:, 0].unique().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch.equal(picked.vision.pixel_values[:8, 0], torch.full((8,), 1.0))  # row 2's first image first
    assert picked.episode_ids.tolist() == [0, 1] and [e.dynamics_seed for e in picked.episodes] == [2, 0]
    assert torch.equal(picked.input_ids, batch.input_ids[[2, 0]]) and len(picked) == 2
    assert batch.select([1]).vision is None
    moved = picked.to("cpu")
    assert moved.view.mask.shape == picked.view.mask.shape and moved.vision.pixel_values.device.type == "cpu"
