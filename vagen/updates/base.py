"""What every policy update provides (PolicyUpdate), what it hands the update stage (Plan), and the actor
loss frame they share: log-probs of a micro-batch, the update's own policy loss, then the KL anchor and
entropy bonus on the tokens the update leaves to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from vagen.algo import kl, masked_mean
from vagen.batching import MicroBatch
from vagen.config import ConfigError, RunConfig
from vagen.metrics import MetricAccumulator
from vagen.models.scoring import Scores, token_and_candidate_logprobs
from vagen.rollout.batch import RolloutBatch

# maps a state critic's outputs on every turn to (predictions, targets) of one regression step
Regression = Callable[[Tensor], tuple[Tensor, Tensor]]


@dataclass
class Plan:
    """What the update stage needs besides the batch and its scores; rows are the kept batch's.

    advantages: (B, L) per-token advantages (mpo: Q(s, a) - V(s) at the action tokens, for the logs)
    returns:    (B, L) value targets of a model critic, or None
    targets:    (B, L, K) mpo: q(.|s) at each acting turn's action token, or None
    critic_inputs, critic_regression: what the state critic regresses on for this batch (None: no fit)
    """

    advantages: Tensor
    returns: Tensor | None = None
    targets: Tensor | None = None
    critic_inputs: list | None = None
    critic_regression: Regression | None = None


class PolicyUpdate(Protocol):
    """One entry of POLICY_UPDATES (algo.policy_loss). The trainer calls, in order: `prepare` on the kept
    batch, fits the state critic (if the run has one) on the plan's regression, `finish`, then for every
    micro-batch `loss`, weighted by the rows' `policy_units`."""

    scores_actions: bool  # scoring also reads the actor's log-prob of every action token at each action token

    def check(self, cfg: RunConfig) -> None:
        """ConfigError (one line) if the config lacks what this update needs beyond the schema."""

    def describe(self, cfg: RunConfig) -> str:
        """One line for the end-of-run report: the update and what it runs with."""

    def critic(self, cfg: RunConfig) -> str | None:
        """The critic the run trains: 'model', 'state' (algo.critic kinds) or None."""

    def state_critic_outputs(self, num_actions: int) -> int:
        """Outputs per state of a state critic: 1 (V(s)) or the number of actions (Q(s, .))."""

    def prepare(self, models: Any, batch: RolloutBatch, scores: Scores, cfg: RunConfig,
                stats: MetricAccumulator) -> Plan: ...  # fmt: skip

    def finish(self, models: Any, plan: Plan, cfg: RunConfig, stats: MetricAccumulator) -> Plan:
        """The plan once the state critic has been fitted on this batch."""

    def policy_units(self, batch: RolloutBatch, plan: Plan, cfg: RunConfig) -> Tensor:
        """(B,) what each row counts towards the mean of the policy loss (tokens, rows, action tokens)."""

    def loss(self, mb: MicroBatch, logp: Tensor, action_logp: Tensor | None, cfg: RunConfig,
             stats: MetricAccumulator) -> tuple[Tensor, Tensor]:  # fmt: skip
        """(the micro-batch's policy loss as a mean over its units, the (b, l) mask of the tokens that the
        KL anchor and the entropy bonus act on)."""


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"bad value for config key '{key}': {message}")


def actor_loss(
    update: PolicyUpdate, models: Any, mb: MicroBatch, cfg: RunConfig, stats: MetricAccumulator
) -> Tensor:
    """update.loss x its weight, + KL to the reference, - entropy bonus, on one micro-batch."""
    part = mb.part
    logp, entropy, action_logp = token_and_candidate_logprobs(
        models.actor.module, part.input_ids, part.attention_mask, part.vision, micro_batch_size=len(part),
        with_entropy=cfg.algo.entropy_coef > 0, temperature=cfg.rollout.temperature,
        candidates=models.action_tokens, at=part.action_token,
    )  # fmt: skip
    if mb.scores is None:  # zero-weight pass: a finite loss that reaches every weight
        return 0.0 * logp.sum()
    policy_loss, held = update.loss(mb, logp, action_logp, cfg, stats)
    return policy_loss * mb.policy_weight + kl_and_entropy_terms(logp, entropy, mb, cfg, held)


def kl_and_entropy_terms(
    logp: Tensor, entropy: Tensor | None, mb: MicroBatch, cfg: RunConfig, mask: Tensor
) -> Tensor:
    """- entropy bonus + KL(actor || reference) over `mask` (b, l), weighted for accumulation (as token
    means over the loss mask: `mb.token_weight`)."""
    algo = cfg.algo
    loss = logp.new_zeros(())
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * masked_mean(entropy, mask) * mb.token_weight
    if mb.scores.ref_logp is not None and not algo.kl_in_reward:
        loss = (
            loss
            + algo.kl_coef * masked_mean(kl(logp, mb.scores.ref_logp, algo.kl_kind), mask) * mb.token_weight
        )
    return loss
