"""The ppo policy update: PPO's clipped surrogate on every loss-masked token, with the advantages of the
estimator `algo.adv` (gae, turn_gae, bilevel_gae = TRICO, grpo, rloo, gigpo; vagen.algo.advantages).

The estimator runs on each episode's packed adv-masked tokens (RolloutBatch.view), with the values of
the run's critic where it uses one: a model critic (its value at every token) or a V state critic (its
V(s_t) on every token of turn t; under token-level `gae` a turn's tokens then differ only by the
discount). A state critic regresses onto the estimator's returns at the turn ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vagen.algo import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGGREGATIONS,
    AdvantageInputs,
    AdvantageParams,
    kl,
    ppo_policy_loss,
)
from vagen.batching import MicroBatch
from vagen.config import RunConfig
from vagen.critics import return_regression
from vagen.distributed import whiten_all_ranks
from vagen.metrics import MetricAccumulator
from vagen.models.scoring import Scores
from vagen.rollout.batch import RolloutBatch
from vagen.updates.base import Plan, require


def state_keys(batch: RolloutBatch) -> list[list[str]]:
    """GiGPO's per-turn state keys of each episode: the env state each turn acted in (its text grid),
    not the message, which also says how the agent got there ("Executed actions: Left.")."""
    return [[t.state for t in ep.turns] for ep in batch.episodes]


def advantages(batch: RolloutBatch, scores: Scores, cfg: RunConfig) -> tuple[Tensor, Tensor | None]:
    """The `algo.adv` estimator on each episode's packed adv-masked tokens; (B, L) advantages, returns."""
    algo = cfg.algo
    rewards = batch.token_rewards.clone()  # (B, L): turn rewards at turn ends
    if algo.kl_in_reward and scores.ref_logp is not None:
        rewards -= algo.kl_coef * kl(scores.old_logp, scores.ref_logp, algo.kl_kind) * batch.loss_mask
    view = batch.view
    groups, episode_returns, _ = batch.episode_outcomes()
    inputs = AdvantageInputs(
        rewards=view.gather(rewards),  # (E, L')
        mask=view.mask,
        turn_end=view.gather(batch.turn_end),
        group_ids=groups.to(rewards.device),
        episode_returns=episode_returns.to(rewards.device),
        values=view.gather(scores.values) if scores.values is not None else None,
        state_keys=state_keys(batch),
    )
    params = AdvantageParams(
        gamma=algo.gamma,
        lam=algo.lam,
        gamma_token=algo.gamma_token,
        lam_token=algo.lam_token,
        scale_by_std=algo.grpo_scale_by_std,
    )
    packed_adv, packed_ret = ADVANTAGE_ESTIMATORS[algo.adv].compute(inputs, params)
    adv = view.scatter(packed_adv.float(), like=rewards)
    returns = view.scatter(packed_ret.float(), like=rewards) if packed_ret is not None else None
    if algo.whiten_advantages:
        adv = whiten_all_ranks(adv, batch.loss_mask)
    return adv, returns


# `algo.kl_tokens` -> the (b, l) tokens the KL anchor and the entropy bonus act on, from (part, loss mask)
KL_TOKEN_MASKS: dict[str, Callable[[RolloutBatch, Tensor], Tensor]] = {
    "loss": lambda part, loss_mask: loss_mask,
    "rest": lambda part, loss_mask: (part.token_turn >= 0) & ~loss_mask,
    "non_action": lambda part, loss_mask: (part.token_turn >= 0) & ~part.action_token,
}


def kl_token_mask(part: RolloutBatch, loss_mask: Tensor, kl_tokens: str) -> Tensor:
    """(b, l) the tokens the KL anchor holds: the loss-masked ones (`loss`), the sampled tokens the
    policy loss leaves alone (`rest`: M^sampled & ~M^loss, TRICO's selective masks), or the sampled tokens
    but each turn's action token (`non_action`: M^sampled & ~M^action, mpo's anchor, whatever the loss)."""
    return KL_TOKEN_MASKS[kl_tokens](part, loss_mask)


def aggregation(cfg: RunConfig) -> str:
    """`algo.loss_agg`, or with `auto` the estimator's own (episode-mean for per-episode advantages)."""
    agg = cfg.algo.loss_agg
    return ADVANTAGE_ESTIMATORS[cfg.algo.adv].aggregation if agg == "auto" else agg


class PPOUpdate:
    """PPO's clipped surrogate (vagen.algo.ppo_policy_loss) on the estimator's token advantages."""

    scores_actions = False

    def check(self, cfg: RunConfig) -> None:
        algo = cfg.algo
        estimator = ADVANTAGE_ESTIMATORS[algo.adv]
        group_size = cfg.rollout.group_size
        require(
            estimator.uses_critic or group_size >= 2,
            "rollout.group_size",
            f"algo.adv={algo.adv} compares the episodes of a group, so a group of {group_size} gets no "
            "advantage: play groups of >= 2 on one level (e.g. rollout.num_groups=32 rollout.group_size=8)",
        )
        require(
            not algo.kl_in_reward or estimator.uses_critic,
            "algo.kl_in_reward",
            f"a per-token KL reward needs a critic-based estimator, not '{algo.adv}' (use the KL loss term)",
        )
        require(
            algo.kl_tokens != "rest" or cfg.rollout.loss_spans != "all",
            "algo.kl_tokens",
            "rest anchors the sampled tokens without policy loss, and with rollout.loss_spans=all there are "
            "none: select the loss spans (e.g. rollout.loss_spans=[answer])",
        )

    def describe(self, cfg: RunConfig) -> str:
        critic = self.critic(cfg)
        return f"ppo, advantages algo.adv={cfg.algo.adv}" + (f", critic {critic}" if critic else "")

    def critic(self, cfg: RunConfig) -> str | None:
        return cfg.algo.critic if ADVANTAGE_ESTIMATORS[cfg.algo.adv].uses_critic else None

    def state_critic_outputs(self, num_actions: int) -> int:
        return 1

    def prepare(
        self, models: Any, batch: RolloutBatch, scores: Scores, cfg: RunConfig, stats: MetricAccumulator
    ) -> Plan:
        if len(batch):
            adv, returns = advantages(batch, scores, cfg)
        else:  # the filter dropped every group of this rank: it only runs zero-weight passes
            adv, returns = torch.zeros_like(batch.token_rewards), torch.zeros_like(batch.token_rewards)
        if models.state_critic is None:
            return Plan(adv, returns)
        inputs, regression = return_regression(batch, returns, models.state_critic.reads)
        return Plan(adv, returns, critic_inputs=inputs, critic_regression=regression)

    def finish(self, models: Any, plan: Plan, cfg: RunConfig, stats: MetricAccumulator) -> Plan:
        return plan

    def policy_units(self, batch: RolloutBatch, plan: Plan, cfg: RunConfig) -> Tensor:
        return LOSS_AGGREGATIONS[aggregation(cfg)].units(batch.loss_mask, batch.episode_ids)

    def loss(
        self,
        mb: MicroBatch,
        logp: Tensor,
        action_logp: Tensor | None,
        cfg: RunConfig,
        stats: MetricAccumulator,
    ) -> tuple[Tensor, Tensor]:
        algo, mask = cfg.algo, mb.part.loss_mask
        pg_loss, pg = ppo_policy_loss(
            logp,
            mb.scores.old_logp,
            mb.adv,
            mask,
            algo.clip_low,
            algo.clip_high,
            algo.dual_clip,
            aggregation(cfg),
            mb.policy_units,
        )
        tokens = mask.sum().item()
        stats.add("actor/pg_loss", pg_loss.item(), tokens)
        stats.add("actor/clipfrac", (pg.clip_frac_upper + pg.clip_frac_lower).item(), tokens)
        stats.add("actor/approx_kl", pg.approx_kl.item(), tokens)
        return pg_loss, kl_token_mask(mb.part, mask, algo.kl_tokens)
