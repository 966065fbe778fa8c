"""The ppo update's KL-anchor tokens: with selective masks (`algo.kl_tokens=rest`) the anchor holds the
sampled tokens the policy loss leaves alone, with `non_action` every sampled token but the action's, and
never the context."""

import torch

from vagen.rollout.batch import EpisodeRecord, RolloutBatch
from vagen.updates.ppo import kl_token_mask


def one_row(token_turn: list[int], loss: list[bool], action: list[bool] | None = None) -> RolloutBatch:
    length = len(token_turn)
    return RolloutBatch(
        input_ids=torch.arange(length)[None],
        attention_mask=torch.ones(1, length, dtype=torch.long),
        vision=None,
        images_per_row=torch.zeros(1, dtype=torch.long),
        loss_mask=torch.tensor([loss]),
        adv_mask=torch.tensor([loss]),
        turn_end=torch.zeros(1, length, dtype=torch.bool),
        token_rewards=torch.zeros(1, length),
        rollout_logprobs=torch.zeros(1, length),
        token_turn=torch.tensor([token_turn]),
        action_token=torch.tensor([action or [False] * length]),
        group_ids=torch.zeros(1, dtype=torch.long),
        episode_ids=torch.zeros(1, dtype=torch.long),
        segment_ids=torch.zeros(1, dtype=torch.long),
        episode_returns=torch.zeros(1),
        success=torch.zeros(1, dtype=torch.bool),
        episodes=[EpisodeRecord(0, 0, 0, 0)],
    )


def test_rest_anchors_the_sampled_tokens_outside_the_loss_and_loss_anchors_the_loss_tokens():
    # context (turn -1), turn 0: <think> x </think> <answer> Up </answer> <end>, context, turn 1: 3 tokens
    token_turn = [-1, -1, 0, 0, 0, 0, 0, 0, 0, -1, 1, 1, 1]
    loss = [False, False, False, False, False, False, True, False, True, False, False, True, True]
    part = one_row(token_turn, loss)
    rest = kl_token_mask(part, part.loss_mask, "rest")[0].tolist()
    assert rest == [False, False, True, True, True, True, False, True, False, False, True, False, False]
    assert kl_token_mask(part, part.loss_mask, "loss")[0].tolist() == loss


def test_non_action_anchors_every_sampled_token_but_each_turns_action_token():
    # as above, the policy loss on every sampled token; the action tokens: `Up` in turn 0, the first of turn 1
    token_turn = [-1, -1, 0, 0, 0, 0, 0, 0, 0, -1, 1, 1, 1]
    loss = [turn >= 0 for turn in token_turn]
    action = [False] * 6 + [True] + [False] * 3 + [True, False, False]
    part = one_row(token_turn, loss, action)
    non_action = kl_token_mask(part, part.loss_mask, "non_action")[0].tolist()
    assert non_action == [False, False, True, True, True, True, False, True, True, False, False, True, True]
