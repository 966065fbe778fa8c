"""Policy improvement over all actions from an action-value critic (MPO's E- and M-step, fixed eta).

For a turn that picked one of K actions in state s, with the rollout policy pi_old(.|s) over the K
action names and a critic Q(s, .):

  Q-critic target (expected SARSA, on the action taken):
      y_t = r_t + gamma * [turn t+1 exists] * sum_a pi_old(a | s_{t+1}) Q(s_{t+1}, a)
  E-step (a non-parametric improved policy, Abdolmaleki et al. 2018, arXiv:1806.06920, eq. 7):
      q(a | s) = softmax_a( log((1 - eps) pi_old(a | s) + eps / K) + (Q(s, a) - V(s)) / eta ),
      V(s) = sum_a pi_old(a | s) Q(s, a)
  M-step (weighted maximum likelihood): loss = mean over turns of -sum_a q(a | s) log pi(a | s).

eta (the temperature) is fixed here instead of MPO's dual for a KL bound; eps mixes in the uniform
policy so that an action the policy has nearly stopped choosing can still be raised when Q says so.
Unlike a sampled policy gradient, every turn grades all K actions, which is what lets a small policy
learn to read its observation from far fewer samples (docs/research/probe-log.md, round 10).
"""

import torch
from torch import Tensor


def candidate_probs(candidate_logp: Tensor) -> Tensor:
    """(N, K) log-probs of K action tokens (full-vocabulary softmax) -> (N, K) probabilities over the
    K actions only (renormalised: mass on other tokens is not an action)."""
    return torch.softmax(candidate_logp.float(), dim=-1)


def expected_sarsa_targets(rewards: Tensor, next_values: Tensor, has_next: Tensor, gamma: float) -> Tensor:
    """y_t = r_t + gamma * has_next_t * V(s_{t+1}).

    rewards (N,) float: the turn's reward; next_values (N,) float: sum_a pi_old(a|s_{t+1}) Q(s_{t+1}, a)
    of the turn after it (any value where has_next is False); has_next (N,) bool: the episode went on
    (a terminal state, a truncation and the end of the turn budget all end the return).
    """
    return rewards.float() + gamma * torch.where(has_next, next_values.float(), 0.0)


def mpo_targets(q_values: Tensor, old_probs: Tensor, eta: float, uniform_mix: float) -> Tensor:
    """q(a|s) = softmax(log((1 - eps) pi_old + eps / K) + (Q - V) / eta) per row; (N, K) -> (N, K).

    q_values (N, K): Q(s, a); old_probs (N, K): pi_old(a|s), rows summing to 1.
    """
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if not 0.0 <= uniform_mix < 1.0:
        raise ValueError(f"uniform_mix must lie in [0, 1), got {uniform_mix}")
    num_actions = q_values.shape[-1]
    advantages = q_values - (old_probs * q_values).sum(dim=-1, keepdim=True)  # (N, K): Q - V
    prior = (1.0 - uniform_mix) * old_probs + uniform_mix / num_actions
    return torch.softmax(torch.log(prior) + advantages / eta, dim=-1)


def action_target_loss(candidate_logp: Tensor, targets: Tensor, mass_coef: float = 1.0) -> Tensor:
    """Mean over rows of -sum_a q(a) log pi(a) - mass_coef * log m, where candidate_logp (N, K) are the
    full-vocabulary log-probs log p(a) at the K action tokens (they carry the gradient), m = sum_a p(a)
    their mass and pi(a) = p(a) / m the policy over the K actions; targets (N, K) are constants summing
    to 1 per row. mass_coef 1 makes the loss the cross-entropy -sum_a q(a) log p(a) over the whole
    vocabulary; a smaller one weakens that pull of mass onto the action tokens (0: only pi - q on the K
    logits). 0 for N = 0 (still attached to the graph)."""
    log_mass = candidate_logp.logsumexp(dim=-1)  # (N,)
    over_actions = candidate_logp - log_mass[:, None]
    mass_loss = (-log_mass).clamp(min=0.0)  # (N,): -log m, >= 0 (float rounding can put m above 1)
    per_row = -(targets.detach() * over_actions).sum(dim=-1) + mass_coef * mass_loss  # (N,)
    return per_row.sum() / max(per_row.numel(), 1)
