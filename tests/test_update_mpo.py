"""The mpo policy update (vagen/updates/mpo.py) on scripted FrozenLake rollouts and hand-made turns, and the
candidate log-probs it reads (vagen.models.scoring)."""

import math

import pytest
import torch
from test_rollout_manager import ScriptedEngine  # a sibling test module

from vagen.config import EnvConfig, RolloutConfig
from vagen.models.loading import load_policy
from vagen.models.scoring import token_and_candidate_logprobs, token_logprobs
from vagen.rollout.assembly import action_token_ids
from vagen.rollout.engines.hf import HFEngine
from vagen.rollout.manager import RolloutManager
from vagen.updates.mpo import (
    ActionTurns,
    action_target_mask,
    action_turns,
    improved_policy,
    rollout_policy,
    sarsa_regression,
)

NAMES = ("Up", "Down", "Left", "Right")
FROZENLAKE = EnvConfig(
    env_id="envs_visual/FrozenLake-v0",
    env_kwargs={"size": 4, "max_steps": 10, "tile_style": "flat"},
    prompt_format="no_think",
    max_actions_per_turn=1,
    instructions="brief",
    instructions_in_system=True,
)
ROLLOUT = RolloutConfig(num_groups=2, group_size=2, max_turns=4, max_new_tokens=8, window=0)


@pytest.fixture(scope="module")
def policy(tiny_vlm_path):
    return load_policy(tiny_vlm_path)


def scripted_batch(processor, replies):
    manager = RolloutManager(FROZENLAKE, ROLLOUT, ScriptedEngine(processor.tokenizer, replies), processor)
    batch = manager.collect(manager.seeds.next_train(2, 2))
    return batch, torch.tensor(action_token_ids(manager.codec, NAMES))


def test_action_turns_list_every_turn_and_the_acting_ones_at_their_action_token(policy):
    _, processor = policy
    # a malformed reply every third turn: it passes a turn without an action (and without an action token)
    batch, tokens = scripted_batch(processor, ["<answer>Right</answer>", "<answer>Down</answer>", "no tags"])
    turns = action_turns(batch, tokens)
    records = [t for ep in batch.episodes for t in ep.turns]
    assert turns.states == [t.state for t in records]
    assert turns.rewards.tolist() == [t.reward for t in records]
    lasts = {sum(len(ep.turns) for ep in batch.episodes[: e + 1]) - 1 for e in range(len(batch.episodes))}
    assert turns.has_next.tolist() == [i not in lasts for i in range(len(records))]
    acting = [i for i, t in enumerate(records) if t.actions]
    assert 0 < len(acting) < len(records) and turns.acted.tolist() == acting
    assert turns.actions.tolist() == [NAMES.index(records[i].actions[0]) for i in acting]
    assert batch.input_ids[turns.rows, turns.cols].tolist() == tokens[turns.actions].tolist()


def test_a_reply_spelling_its_action_with_other_tokens_does_not_act_for_the_update(policy):
    _, processor = policy
    batch, tokens = scripted_batch(processor, ["<answer> Down</answer>"])  # " Down": not the ">Down" token
    assert all(turn.actions == ["Down"] for ep in batch.episodes for turn in ep.turns)  # every turn acted
    assert batch.action_token.sum() == 0  # but none chose with Down's token: none is graded
    assert len(action_turns(batch, tokens).acted) == 0


def hand_made_turns() -> ActionTurns:
    """Episode 0: three turns (the second did not act), episode 1: one turn that reached the goal."""
    return ActionTurns(
        states=["s0", "s1", "s2", "t0"],
        rewards=torch.tensor([0.0, 0.0, 0.0, 10.0]),
        has_next=torch.tensor([True, True, False, False]),
        acted=torch.tensor([0, 2, 3]),
        actions=torch.tensor([1, 3, 0]),
        rows=torch.tensor([0, 1, 2]),
        cols=torch.tensor([4, 4, 4]),
    )


def test_sarsa_regression_bootstraps_from_the_next_turn_under_the_rollout_policy():
    turns = hand_made_turns()
    probs = torch.tensor([[0.5, 0.5, 0, 0], [0.25] * 4, [0, 0, 0.5, 0.5], [1.0, 0, 0, 0]])
    q = torch.tensor([[1.0, 2, 3, 4], [4.0, 0, 0, 0], [2.0, 2, 6, 2], [7.0, 0, 0, 0]])
    predicted, targets = sarsa_regression(turns, probs, gamma=0.5)(q)
    # V = (1.5, 1.0, 4.0, 7.0). Turn 0 -> 0 + 0.5 * V(s1) = 0.5 (its next turn s1 did not act: uniform);
    # turn 2 is its episode's last -> 0; turn 3 reached the goal -> 10. Predictions: Q(s0, Down),
    # Q(s2, Right), Q(t0, Up).
    assert predicted.tolist() == [2.0, 2.0, 7.0]
    assert targets.tolist() == [0.5, 0.0, 10.0]


def test_improved_policy_places_the_targets_and_the_advantage_at_the_action_tokens():
    turns = hand_made_turns()
    probs = torch.full((4, 4), 0.25)
    q = torch.tensor([[0.0, 4.0, 0, 0], [0.0] * 4, [0.0] * 4, [2.0, 2, 2, 2]])
    targets, advantages = improved_policy(torch.Size((3, 6)), turns, probs, q, eta=1.0, uniform_mix=0.0)
    acting = action_target_mask(targets)
    assert acting.nonzero().tolist() == [[0, 4], [1, 4], [2, 4]]
    weights = torch.tensor([1.0, math.exp(4.0), 1.0, 1.0])  # A = Q - V = (-1, 3, -1, -1)
    torch.testing.assert_close(targets[0, 4], weights / weights.sum())
    torch.testing.assert_close(targets[2, 4], torch.full((4,), 0.25))  # flat Q: pi_old
    assert advantages[0, 4] == 3.0 and advantages[2, 4] == 0.0 and advantages.abs().sum() == 3.0


def test_candidate_logprobs_equal_the_sampled_tokens_logprob_where_it_was_a_candidate(
    policy, one_torch_thread
):
    model, processor = policy
    manager = RolloutManager(FROZENLAKE, ROLLOUT, HFEngine(model, processor), processor)
    batch = manager.collect(manager.seeds.next_train(2, 2))
    tokens = torch.tensor(action_token_ids(manager.codec, NAMES))
    # the untrained model rarely writes a well-formed answer: mark every sampled token as a candidate
    # position instead, and use the ids it sampled as the candidates, so each marked row has its token
    at = batch.loss_mask.clone()
    candidates = torch.unique(batch.input_ids[at])
    args = (batch.input_ids, batch.attention_mask, batch.vision, 3)
    logp, _, cand = token_and_candidate_logprobs(model, *args, False, candidates=candidates, at=at)
    reference, _ = token_logprobs(model, *args, False)
    torch.testing.assert_close(logp, reference)
    sampled = (batch.input_ids[at][:, None] == candidates[None, :]).float().argmax(dim=1)
    torch.testing.assert_close(cand[at].gather(1, sampled[:, None]).squeeze(1), logp[at], atol=1e-5, rtol=0)
    assert cand[~at].abs().sum() == 0 and cand.shape == (*batch.input_ids.shape, len(candidates))
    assert rollout_policy(action_turns(batch, tokens), cand[..., :4], 4).sum(dim=1).allclose(torch.ones(1))
