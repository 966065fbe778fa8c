"""The mpo update's math (vagen/algo/mpo.py) against hand-worked numbers."""

import math

import pytest
import torch

from vagen.algo.mpo import action_target_loss, candidate_probs, expected_sarsa_targets, mpo_targets


def assert_close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_expected_sarsa_bootstraps_only_where_the_episode_goes_on():
    # y = r + 0.9 * V(next) where a next turn exists: 0 + 0.9 * 5 = 4.5; 10 (goal, terminal); 1 (last turn)
    rewards = torch.tensor([0.0, 10.0, 1.0])
    next_values = torch.tensor([5.0, 7.0, 3.0])
    has_next = torch.tensor([True, False, False])
    assert_close(expected_sarsa_targets(rewards, next_values, has_next, 0.9), [4.5, 10.0, 1.0])


def test_mpo_targets_weight_the_old_policy_by_exp_advantage_over_eta():
    # pi_old = (0.5, 0.5, 0, 0), Q = (2, 0, 4, 0): V = 1, A = (1, -1, 3, -1).
    # eps = 0.2 -> prior = 0.8 * pi_old + 0.05 = (0.45, 0.45, 0.05, 0.05); eta = 1:
    # q ~ (0.45 e, 0.45 / e, 0.05 e^3, 0.05 / e), normalised.
    q_values = torch.tensor([[2.0, 0.0, 4.0, 0.0]])
    old = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    weights = torch.tensor([0.45 * math.e, 0.45 / math.e, 0.05 * math.e**3, 0.05 / math.e])
    assert_close(mpo_targets(q_values, old, eta=1.0, uniform_mix=0.2), [(weights / weights.sum()).tolist()])
    # without the uniform share an action pi_old never takes stays at 0, however good Q says it is
    assert mpo_targets(q_values, old, eta=1.0, uniform_mix=0.0)[0, 2] == 0.0


def test_mpo_targets_keep_pi_old_when_q_is_flat_and_sharpen_as_eta_falls():
    old = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    assert_close(mpo_targets(torch.full((1, 4), 3.0), old, eta=0.5, uniform_mix=0.0), old)
    q_values = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    sharp = mpo_targets(q_values, old, eta=0.01, uniform_mix=0.0)
    assert_close(sharp, [[0.0, 0.0, 0.0, 1.0]])


@pytest.mark.parametrize(("eta", "mix"), [(0.0, 0.1), (-1.0, 0.1), (1.0, 1.0), (1.0, -0.1)])
def test_mpo_targets_refuse_bad_settings(eta, mix):
    with pytest.raises(ValueError):
        mpo_targets(torch.zeros(1, 4), torch.full((1, 4), 0.25), eta, mix)


def test_candidate_probs_renormalise_over_the_actions():
    # full-vocabulary log-probs 0.1, 0.3 (0.6 elsewhere) -> 0.25, 0.75 over the two actions
    probs = candidate_probs(torch.tensor([[math.log(0.1), math.log(0.3)]]))
    assert_close(probs, [[0.25, 0.75]])


def test_action_target_loss_is_the_mean_cross_entropy_and_its_gradient_is_pi_minus_q():
    logits = torch.tensor([[0.0, 0.0], [1.0, -1.0]], requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    loss = action_target_loss(logp, targets)
    # row 0: -log 0.5; row 1: -(0.5 log s(2) + 0.5 log s(-2)) with s the sigmoid
    sig = 1 / (1 + math.exp(-2.0))
    expected = (math.log(2) - 0.5 * (math.log(sig) + math.log(1 - sig))) / 2
    assert_close(loss, expected)
    loss.backward()
    pi = torch.softmax(logits.detach(), dim=-1)
    assert_close(logits.grad, ((pi - targets) / 2).tolist())
    assert action_target_loss(torch.zeros(0, 4, requires_grad=True), torch.zeros(0, 4)).item() == 0.0


def test_action_target_loss_weighs_the_pull_of_mass_onto_the_action_tokens():
    # two action tokens holding half the vocabulary's mass (0.25 each, the rest on a third token):
    # mass_coef 1 is the full-vocabulary cross-entropy -log 0.25 = log 4; mass_coef 0 the cross-entropy of
    # the policy over the two actions, -log 0.5 = log 2; 0.5 adds half of -log m = log 2
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5]])).requires_grad_(True)
    candidate_logp = torch.log_softmax(logits, dim=-1)[:, :2]
    targets = torch.tensor([[1.0, 0.0]])
    assert_close(action_target_loss(candidate_logp, targets), math.log(4))
    assert_close(action_target_loss(candidate_logp, targets, mass_coef=0.5), 1.5 * math.log(2))
    loss = action_target_loss(candidate_logp, targets, mass_coef=0.0)
    assert_close(loss, math.log(2))
    loss.backward()
    assert_close(logits.grad, [[0.5 - 1.0, 0.5, 0.0]])  # pi - q over the two actions, 0 on the third


def test_action_target_loss_mass_term_on_every_row():
    # row 0: two action tokens at 0.25 each (mass 0.5); row 1: 0.45 each (mass 0.9); uniform targets
    # against a uniform pi: the cross-entropy over the actions is log 2 on each row
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.45, 0.45, 0.1]]))
    candidate_logp = torch.log_softmax(logits, dim=-1)[:, :2]
    targets = torch.full((2, 2), 0.5)
    loss = action_target_loss(candidate_logp, targets, mass_coef=0.5)
    assert_close(loss, math.log(2) - 0.5 * (math.log(0.5) + math.log(0.9)) / 2)
