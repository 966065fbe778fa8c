"""The RL loop: rollout -> score -> filter -> advantages -> DeepSpeed update -> log.

`train(cfg)` reads top to bottom in that order. One iteration ("step"):
1. rollout: this rank's share of the G groups x n episodes (the engine generates with the actor's
   current weights: `sync_weights` after every update);
2. score: old log-probs (actor), reference log-probs, values (critic) of the sampled tokens;
3. filter (StarPO-S): keep the groups whose raw returns vary most, ranked over ALL ranks' groups;
4. advantages: the estimator named by `algo.adv`, run on each episode's packed tokens (EpisodeView);
5. update: `ppo_epochs` x `mini_batches` optimizer steps (fixed whatever the filter kept), each
   from the same number of micro-batches on every rank, `engine.backward` / `engine.step` in the open;
6. log: metrics reduced over ranks, collapse alarms, validation, GIFs, checkpoints.
"""

import dataclasses
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import transformers
from deepspeed.utils import safe_get_full_grad, safe_set_full_grad

from envs_visual.language import PROMPT_FORMATS
from vagen import checkpoint
from vagen.action_targets import (
    MpoPlan,
    action_target_mask,
    action_turns,
    mpo_plan,
    rollout_policy,
    sarsa_regression,
)
from vagen.algo import (
    ADVANTAGE_ESTIMATORS,
    GROUP_FILTERS,
    AdvantageInputs,
    AdvantageParams,
    kl,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)
from vagen.algo.mpo import action_target_loss
from vagen.config import ConfigError, DerivedSizes, RunConfig, as_dict, derived_sizes, needs_critic, to_yaml
from vagen.critic_fit import fit_state_critic, return_regression, state_values
from vagen.distributed import comm_device, global_sum, init_distributed
from vagen.metrics import (
    Alarms,
    MetricAccumulator,
    MetricsLogger,
    add_value_moments,
    read_metrics,
    rollout_metrics,
    scoring_metrics,
    with_explained_variance,
)
from vagen.models.loading import ValueModel, load_policy, tokenizer_of
from vagen.models.scoring import token_and_candidate_logprobs, token_logprobs, token_values
from vagen.models.state_critic import FeatureCritic, StateCritic, TurnCritic
from vagen.report import end_of_run_report
from vagen.rollout.assembly import ChatCodec, action_token_ids
from vagen.rollout.batch import RolloutBatch
from vagen.rollout.engines.base import make_engine
from vagen.rollout.evaluate import wilson_interval
from vagen.rollout.manager import RolloutManager, make_language_env, read_chat_template
from vagen.sft import warm_start_model
from vagen.viz.html import write_step_page

# ----------------------------------------------------------------------------------------------
# start-up: processes, seeds, engines


def seed_everything(seed: int, rank: int) -> None:
    """Seed python, numpy and torch. Per-rank offset: ranks must not draw identical random streams
    (dropout, shuffles); rollouts get their own seeds from the level schedule, not from these."""
    rank_seed = seed + 100_003 * rank
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)


def deepspeed_config(cfg: RunConfig, sizes: DerivedSizes) -> dict[str, Any]:
    """The JSON file of `trainer.deepspeed` with its "auto" entries filled from the run config.

    The optimizer and LR schedule belong to the run config (a torch AdamW, no JIT-compiled Adam),
    so a DeepSpeed file that defines them is refused.
    """
    ds = json.loads(Path(cfg.trainer.deepspeed).read_text())
    for owned in ("optimizer", "scheduler"):
        if owned in ds:
            raise ConfigError(
                f"{cfg.trainer.deepspeed} defines '{owned}'; set it in the run config (optim.*)"
            )
    filled = {
        "train_micro_batch_size_per_gpu": cfg.trainer.micro_batch_size,
        "gradient_accumulation_steps": sizes.micro_batches_per_step,
        "train_batch_size": cfg.trainer.micro_batch_size * sizes.micro_batches_per_step * sizes.world_size,
        "gradient_clipping": cfg.optim.grad_clip,
    }
    for key, value in filled.items():
        if ds.get(key, "auto") not in ("auto", value):
            raise ConfigError(
                f"{cfg.trainer.deepspeed}: '{key}' is {ds[key]} but the run config needs {value}"
            )
        ds[key] = value
    ds.setdefault("bf16", {})["enabled"] = cfg.model.dtype == "bfloat16"
    return ds


def lr_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, decay: str = "constant", total_steps: int = 1
) -> torch.optim.lr_scheduler.LambdaLR:
    """lr_k = lr * min(1, (k + 1) / warmup_steps) * d_k for optimizer step k = 0, 1, ...;
    d_k = 1 ("constant") or max(0, 1 - k / total_steps) ("linear": the last step's lr is lr / total_steps)."""

    def factor(k: int) -> float:
        warmup = min(1.0, (k + 1) / max(1, warmup_steps))
        return warmup * (max(0.0, 1.0 - k / max(1, total_steps)) if decay == "linear" else 1.0)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_deepspeed_engine(model: torch.nn.Module, lr: float, cfg: RunConfig, sizes: DerivedSizes):
    optim = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_schedule(
            optimizer,
            optim.warmup_steps,
            optim.lr_decay,
            cfg.trainer.steps * sizes.optimizer_steps_per_iteration,
        ),
        config=deepspeed_config(cfg, sizes),
    )
    return engine


@dataclass
class Models:
    actor: Any  # DeepSpeedEngine around the policy
    critic: Any | None  # DeepSpeedEngine around a ValueModel (critic-based estimators, algo.critic=model)
    reference: torch.nn.Module | None  # frozen policy; None without KL, or under LoRA (adapter off)
    processor: Any
    generation: Any  # GenerationEngine
    state_critic: TurnCritic | None = None  # critic=state: V(s) (mpo: Q(s, .)) of the env state
    state_critic_optim: torch.optim.Optimizer | None = None
    action_tokens: torch.Tensor | None = None  # policy_loss=mpo: (K,) the token of each action name


def build_models(cfg: RunConfig, sizes: DerivedSizes) -> Models:
    """Actor, critic and reference, all starting from `model.path` or its warm start."""
    m = cfg.model
    if dist.get_rank() == 0:  # rank 0 builds (or finds) the cached warm start, the others then read it
        start = warm_start_model(cfg)
    dist.barrier()
    if dist.get_rank() != 0:
        start = warm_start_model(cfg)
    load = dict(
        dtype=m.dtype, attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code
    )
    lora = None
    if m.lora.rank > 0:
        lora = {"r": m.lora.rank, "lora_alpha": m.lora.alpha, "lora_dropout": m.lora.dropout}
        if m.lora.target_modules is not None:
            lora["target_modules"] = list(m.lora.target_modules)
    policy, processor = load_policy(start, gradient_checkpointing=m.gradient_checkpointing, lora=lora, **load)
    actor = make_deepspeed_engine(policy, cfg.optim.actor_lr, cfg, sizes)
    critic = state_critic = state_critic_optim = action_tokens = None
    language_env = make_language_env(cfg.env)
    if cfg.algo.policy_loss == "mpo":
        codec = ChatCodec(processor, read_chat_template(cfg.rollout.chat_template))
        action_tokens = torch.tensor(action_token_ids(codec, language_env.action_names))
    if needs_critic(cfg) and cfg.algo.critic == "state":
        outputs = 1 if action_tokens is None else len(action_tokens)  # mpo: Q(s, a) of every action
        if cfg.algo.state_critic_input == "features":
            probe, _ = language_env.reset(seed=cfg.rollout.seed)
            if probe.features is None:
                raise ValueError(
                    f"algo.state_critic_input=features: {cfg.env.env_id} has no state_features()"
                )
            state_critic = FeatureCritic(len(probe.features), outputs=outputs)
        else:
            state_critic = StateCritic(cfg.algo.state_critic_max_bytes, outputs=outputs)
        state_critic = state_critic.to(comm_device())
        for p in state_critic.parameters():  # ranks seed differently: start from rank 0's weights
            dist.broadcast(p.data, src=0)
        state_critic_optim = torch.optim.AdamW(
            state_critic.parameters(), lr=cfg.optim.critic_lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps
        )
    elif needs_critic(cfg):
        value_model = ValueModel.from_pretrained(
            m.critic_path or start, m.dtype, m.attn_implementation, m.gradient_checkpointing
        )
        critic = make_deepspeed_engine(value_model, cfg.optim.critic_lr, cfg, sizes)
    reference = None
    if cfg.algo.kl_coef > 0 and lora is None:
        reference, _ = load_policy(start, **load)
        reference.to(comm_device()).eval().requires_grad_(False)
    # vLLM keeps its own copy of the weights (synced after every update) and sizes its budgets up front
    generation = make_engine(cfg.rollout.engine, actor.module, processor, **cfg.rollout.engine_options())
    return Models(
        actor, critic, reference, processor, generation, state_critic, state_critic_optim, action_tokens
    )


# ----------------------------------------------------------------------------------------------
# the stages of one iteration


def rollout_share(manager: RolloutManager, cfg: RunConfig, rank: int, world: int) -> RolloutBatch:
    """Every rank draws the same next G training levels and plays its own slice of the groups."""
    seeds = manager.seeds.next_train(cfg.rollout.num_groups, cfg.rollout.group_size)
    per_rank = len(seeds) // world
    return manager.collect(seeds[rank * per_rank : (rank + 1) * per_rank], training=True)


@dataclass
class Scores:
    """Per-token scores of a batch's rows, (B, L) float32 each ((B, L, K) for the action log-probs)."""

    old_logp: torch.Tensor  # actor at rollout time
    entropy: torch.Tensor  # actor's entropy at rollout time
    ref_logp: torch.Tensor | None  # frozen reference
    values: torch.Tensor | None  # critic (mpo: none, its Q is per turn)
    action_logp: torch.Tensor | None = None  # mpo: (B, L, K) actor's log-probs of every action token

    def select(self, rows: torch.Tensor) -> "Scores":
        return Scores(*(None if t is None else t[rows] for t in vars(self).values()))


@torch.no_grad()
def score(models: Models, batch: RolloutBatch, cfg: RunConfig) -> Scores:
    args = (batch.input_ids, batch.attention_mask, batch.vision, cfg.trainer.score_micro_batch_size)
    temperature = cfg.rollout.temperature  # the distribution the tokens were sampled from
    old_logp, entropy, action_logp = token_and_candidate_logprobs(
        models.actor.module, *args, with_entropy=True, temperature=temperature,
        candidates=models.action_tokens, at=batch.action_token,
    )  # fmt: skip
    ref_logp = None
    if models.reference is not None:
        ref_logp, _ = token_logprobs(models.reference, *args, with_entropy=False, temperature=temperature)
    elif cfg.algo.kl_coef > 0:  # LoRA: the reference is the actor without its adapter
        with models.actor.module.disable_adapter():
            ref_logp, _ = token_logprobs(
                models.actor.module, *args, with_entropy=False, temperature=temperature
            )
    values = None
    if models.critic is not None:
        values = token_values(models.critic.module, *args)
    elif models.state_critic is not None and cfg.algo.policy_loss != "mpo":
        values = state_values(models.state_critic, batch)
    return Scores(old_logp, entropy, ref_logp, values, action_logp)


def filter_groups(batch: RolloutBatch, cfg: RunConfig, world: int) -> tuple[torch.Tensor, int, int]:
    """StarPO-S over the groups of all ranks; returns (this rank's kept rows, kept groups, all groups).

    Ranks hold equal numbers of episodes, so the per-episode (group, return) pairs are all-gathered,
    the filter ranks every group once, and each rank keeps the rows of its own kept episodes.
    """
    groups, returns, _ = batch.episode_outcomes()  # (E,) each; group ids are global level indices
    local = torch.stack([groups.double(), returns.double()]).to(comm_device())  # (2, E)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)  # named collective: every rank's (group, return) per episode
    all_groups, all_returns = torch.cat(gathered, dim=1).cpu()  # (E * world,)
    f = cfg.algo.filter
    kept = GROUP_FILTERS[f.rule](all_returns, all_groups.long(), f.keep, f.drop_zero_std)  # global episodes
    first = dist.get_rank() * len(batch.episodes)
    kept_local = kept[(kept >= first) & (kept < first + len(batch.episodes))] - first
    rows = torch.isin(batch.episode_ids.cpu(), kept_local).nonzero().flatten()
    return rows, int(torch.unique(all_groups[kept]).numel()), int(torch.unique(all_groups).numel())


def state_keys(batch: RolloutBatch) -> list[list[str]]:
    """GiGPO's per-turn state keys of each episode: the env state each turn acted in (its text grid),
    not the message, which also says how the agent got there ("Executed actions: Left.")."""
    return [[t.state for t in ep.turns] for ep in batch.episodes]


def advantages(
    batch: RolloutBatch, scores: Scores, cfg: RunConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
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
        state_keys=state_keys(batch) if algo.adv == "gigpo" else None,
    )
    params = AdvantageParams(
        gamma=algo.gamma,
        lam=algo.lam,
        gamma_turn=algo.gamma_turn,
        lam_turn=algo.lam_turn,
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


def mpo_update_plan(
    models: Models, batch: RolloutBatch, scores: Scores, cfg: RunConfig, stats: MetricAccumulator
) -> MpoPlan:
    """policy_loss=mpo: refit the Q-critic on this batch (expected SARSA under the rollout policy), then
    the improved policy at every action token from its Q (MPO fits the critic before the policy)."""
    algo, critic = cfg.algo, models.state_critic
    turns = action_turns(batch, models.action_tokens, critic.reads)
    probs = rollout_policy(turns, scores.action_logp, len(models.action_tokens))  # (N, K)
    regression = sarsa_regression(turns, probs, algo.gamma)
    fit_state_critic(*state_critic_pair(models), turns.states, regression, algo.state_critic_steps, stats)
    with torch.no_grad():
        q = critic(turns.states).float() if turns.states else probs.new_zeros(probs.shape)  # (N, K)
    stats.add("critic/q_mean", q.mean().item() if len(q) else 0.0, len(q))
    stats.add("train/acting_turn_share", len(turns.acted) / max(len(turns.states), 1), len(turns.states))
    return mpo_plan(
        batch.input_ids.shape, turns, probs, q.to(probs.device), algo.mpo_eta, algo.mpo_uniform_mix
    )


def whiten_all_ranks(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries of every rank (named reduction: SUM of n, sum, sum sq)."""
    m = mask.bool()
    moments = torch.stack([m.sum().double(), x[m].double().sum(), (x[m].double() ** 2).sum()]).to(
        comm_device()
    )
    dist.all_reduce(moments)
    n, total, total_sq = moments.tolist()
    mean = total / max(n, 1.0)
    var = max(total_sq / max(n, 1.0) - mean**2, 0.0)
    return torch.where(m, (x - mean) / math.sqrt(var + eps), 0.0)


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int, count: int) -> list[torch.Tensor]:
    """Split a mini-batch's rows into exactly `count` micro-batches of at most `size` rows, padding least.

    Every rank runs `count` forward/backward passes anyway, so rows are spread over all of them:
    rows sorted by length (descending) are cut into <= `count` consecutive runs of <= `size` rows
    minimising the padded slots sum_runs (rows_in_run * longest_in_run - tokens_in_run), by dynamic
    programming over cut points (O(count * n * size)). Missing micro-batches are empty (the caller
    runs them with zero weight).
    """
    if len(rows) > count * size:
        raise RuntimeError(f"{len(rows)} rows need more than {count} micro-batches of {size}")
    ordered = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    sorted_lengths = lengths[ordered].tolist()
    n = len(ordered)
    prefix = [0]
    for length in sorted_lengths:
        prefix.append(prefix[-1] + length)

    def padding(i: int, j: int) -> int:  # rows i..j-1 in one micro-batch, the longest is row i
        return (j - i) * sorted_lengths[i] - (prefix[j] - prefix[i])

    # best[k][j]: least padding of the first j rows in k runs; cut[k][j]: where the last run starts
    best = [[math.inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        best[k][0] = 0
        for j in range(1, n + 1):
            for i in range(max(0, j - size), j):
                candidate = best[k - 1][i] + padding(i, j)
                if candidate < best[k][j]:
                    best[k][j], cut[k][j] = candidate, i
    parts, j, k = [], n, min(range(count + 1), key=lambda k: (best[k][n], k))
    while j > 0:
        parts.insert(0, ordered[cut[k][j] : j])
        j, k = cut[k][j], k - 1
    return parts + [ordered[:0]] * (count - len(parts))


def guarded_step(engine, max_grad_norm: float) -> tuple[float, bool]:
    """engine.step() at a gradient-accumulation boundary unless the gradient norm is bad.

    The global norm is computed from the reduced gradients before stepping. If it is not finite or
    exceeds `max_grad_norm`, one gradient entry is set to NaN so that DeepSpeed's own overflow path
    skips the optimizer (parameters, moments and LR schedule untouched) and clears the gradients.
    Returns (norm, skipped). Collective: all ranks call it on the same micro-step.
    """
    params = [p for p in engine.module.parameters() if p.requires_grad]
    squares = 0.0
    for p in params:  # ZeRO-3: safe_get_full_grad gathers each partition (collective)
        grad = safe_get_full_grad(p)
        if grad is not None:
            squares += float(grad.double().pow(2).sum())
    norm = math.sqrt(squares) if math.isfinite(squares) else math.inf
    skip = not norm <= max_grad_norm
    if skip:
        grad = safe_get_full_grad(params[0])
        safe_set_full_grad(params[0], torch.full_like(grad, math.nan))
    engine.step()
    return norm, skip


@dataclass
class MicroBatch:
    """Rows of one forward/backward, trimmed to their longest row, with their loss weights.

    Loss normalisation across micro-batches and ranks: DeepSpeed divides each backward by the
    accumulation count and averages gradients over ranks, so a micro-batch's loss is multiplied by
    world * accumulation * (its share of the mini-batch's tokens, or rows for seq-mean losses,
    counted over all ranks): the applied gradient is that of the mini-batch loss over all ranks'
    data, as in one process. A padding micro-batch (no rows left on this rank) has weight 0.
    """

    part: RolloutBatch  # (b, l) rows
    scores: Scores | None  # None for a zero-weight padding pass
    adv: torch.Tensor | None  # (b, l)
    returns: torch.Tensor | None  # (b, l)
    targets: torch.Tensor | None  # mpo: (b, l, K) q(.|s) at the action tokens
    policy_weight: float  # scale of the policy-loss term (by its aggregation; mpo: share of action tokens)
    token_weight: float  # scale of token-mean terms (entropy, KL) of the actor
    value_weight: float  # scale of the critic's token-mean loss


def trimmed(x: torch.Tensor | None, length: int) -> torch.Tensor | None:
    return None if x is None else x[:, :length]


def actor_loss(models: Models, mb: MicroBatch, cfg: RunConfig, stats: MetricAccumulator) -> torch.Tensor:
    """PPO clipped surrogate, or mpo's action-target cross-entropy (+ KL to the reference, - entropy
    bonus), weighted for accumulation."""
    algo, part = cfg.algo, mb.part
    mpo = algo.policy_loss == "mpo"
    logp, entropy, action_logp = token_and_candidate_logprobs(
        models.actor.module, part.input_ids, part.attention_mask, part.vision, micro_batch_size=len(part),
        with_entropy=algo.entropy_coef > 0, temperature=cfg.rollout.temperature,
        candidates=models.action_tokens if mpo else None, at=part.action_token,
    )  # fmt: skip
    if mb.scores is None:  # zero-weight pass: a finite loss that reaches every weight
        return 0.0 * logp.sum()
    mask = part.loss_mask
    if mpo:
        acting = action_target_mask(mb.targets)  # (b, l)
        acting_logp = action_logp[acting]  # (n, K): the acting turns' action-token log-probs
        loss = action_target_loss(acting_logp, mb.targets[acting], algo.mpo_mass_coef, algo.mpo_mass_floor)
        loss = loss * mb.policy_weight
        stats.add("actor/mpo_loss", loss.item() / max(mb.policy_weight, 1e-12), int(acting.sum()))
        action_mass = acting_logp.detach().logsumexp(dim=-1).exp()  # the reply format's hold
        stats.add(
            "actor/action_mass",
            action_mass.mean().item() if action_mass.numel() else 1.0,
            action_mass.numel(),
        )
        log_ratio = torch.where(mask, logp - mb.scores.old_logp, 0.0).detach()  # k3 estimate, as PPO's stats
        approx_kl = masked_mean(log_ratio.exp() - 1 - log_ratio, mask).item()
        stats.add("actor/approx_kl", approx_kl, mask.sum().item())
        # the KL anchor holds the reply's other tokens (its format); the action is the target's to set
        return loss + kl_and_entropy_terms(logp, entropy, mb, cfg, mask & ~acting)
    pg_loss, pg = ppo_policy_loss(
        logp, mb.scores.old_logp, mb.adv, mask, algo.clip_low, algo.clip_high, algo.dual_clip, algo.loss_agg
    )
    tokens = mask.sum().item()
    stats.add("actor/pg_loss", pg_loss.item(), tokens)
    stats.add("actor/clipfrac", (pg.clip_frac_upper + pg.clip_frac_lower).item(), tokens)
    stats.add("actor/approx_kl", pg.approx_kl.item(), tokens)
    return pg_loss * mb.policy_weight + kl_and_entropy_terms(logp, entropy, mb, cfg, mask)


def kl_and_entropy_terms(
    logp: torch.Tensor, entropy: torch.Tensor | None, mb: MicroBatch, cfg: RunConfig, mask: torch.Tensor
) -> torch.Tensor:
    """- entropy bonus + KL(actor || reference) over `mask` (B, L), weighted for accumulation (as
    token means over the loss mask: `mb.token_weight`)."""
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


def critic_loss(models: Models, mb: MicroBatch, cfg: RunConfig, stats: MetricAccumulator) -> torch.Tensor:
    """Clipped value loss on the adv-masked tokens, weighted for accumulation."""
    part = mb.part
    values = token_values(models.critic.module, part.input_ids, part.attention_mask, part.vision, len(part))
    if mb.scores is None:
        return 0.0 * values.sum()
    mask = part.adv_mask
    loss, vf = value_loss(values, mb.scores.values, mb.returns, mask, cfg.algo.vf_clip)
    stats.add("critic/vf_loss", loss.item(), mask.sum().item())
    stats.add("critic/clipfrac", vf.clip_frac.item(), mask.sum().item())
    add_value_moments(stats, values.detach(), mb.returns, mask)
    return loss * mb.value_weight


def backward_and_step(
    engine, loss: torch.Tensor, max_grad_norm: float, prefix: str, stats: MetricAccumulator
) -> int:
    """engine.backward, then engine.step (guarded at accumulation boundaries); returns 1 if skipped."""
    engine.backward(loss)
    if not engine.is_gradient_accumulation_boundary():
        engine.step()  # DeepSpeed counts micro-steps; no optimizer step happens here
        return 0
    norm, skipped = guarded_step(engine, max_grad_norm)
    stats.add(f"{prefix}/grad_norm", norm if math.isfinite(norm) else 0.0)
    return int(skipped)


def mini_batch_plan(
    batch: RolloutBatch, mini: torch.Tensor, scores: Scores, adv: torch.Tensor, returns: torch.Tensor | None,
    targets: torch.Tensor | None, pad_row: RolloutBatch, cfg: RunConfig, sizes: DerivedSizes,
) -> list[MicroBatch]:  # fmt: skip
    """The `micro_batches_per_step` micro-batches of one mini-batch (row indices `mini`) on this rank."""
    seq_agg = cfg.algo.loss_agg != "token-mean"
    acting = action_target_mask(targets) if targets is not None else None  # mpo: (B, L)
    action_tokens = global_sum(acting[mini].sum()) if acting is not None else 0.0
    tokens = global_sum(batch.loss_mask[mini].sum())
    seqs = global_sum(batch.loss_mask[mini].any(dim=1).sum())
    value_tokens = global_sum(batch.adv_mask[mini].sum())
    scale = sizes.world_size * sizes.micro_batches_per_step
    lengths = batch.attention_mask.sum(dim=1).cpu()  # (B,)
    plan = []
    for rows in micro_batches(mini, lengths, cfg.trainer.micro_batch_size, sizes.micro_batches_per_step):
        if not len(rows):
            plan.append(MicroBatch(pad_row, None, None, None, None, 0.0, 0.0, 0.0))
            continue
        length = int(lengths[rows].max())
        part = batch.select(rows)
        width = part.input_ids.shape[1]
        part = dataclasses.replace(  # every (b, L) field cut to the longest row
            part,
            **{
                k: v[:, :length]
                for k, v in vars(part).items()
                if torch.is_tensor(v) and v.shape[1:] == (width,)
            },
        )
        part_scores = Scores(*(trimmed(t, length) for t in vars(scores.select(rows)).values()))
        loss_mask = part.loss_mask
        if acting is not None:
            policy_share = acting[rows].sum().item() / max(action_tokens, 1)
        elif seq_agg:
            policy_share = loss_mask.any(dim=1).sum().item() / max(seqs, 1)
        else:
            policy_share = loss_mask.sum().item() / max(tokens, 1)
        plan.append(
            MicroBatch(
                part=part,
                scores=part_scores,
                adv=adv[rows, :length],
                returns=trimmed(returns[rows] if returns is not None else None, length),
                targets=trimmed(targets[rows] if targets is not None else None, length),
                policy_weight=scale * policy_share,
                token_weight=scale * loss_mask.sum().item() / max(tokens, 1),
                value_weight=scale * part.adv_mask.sum().item() / max(value_tokens, 1),
            )
        )
    return plan


def update(
    models: Models,
    batch: RolloutBatch,
    scores: Scores,
    adv: torch.Tensor,
    returns: torch.Tensor | None,
    pad_row: RolloutBatch,
    cfg: RunConfig,
    sizes: DerivedSizes,
    generator: torch.Generator,
    stats: MetricAccumulator,
    targets: torch.Tensor | None = None,
) -> tuple[int, int]:
    """ppo_epochs x mini_batches optimizer steps of the actor (and critic), same count on every rank;
    `targets` (B, L, K): mpo's action targets.

    Returns (actor steps skipped by the gradient guard, real tokens processed on this rank).
    """
    skipped = processed = 0
    for _ in range(cfg.algo.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for mini in order.tensor_split(cfg.algo.mini_batches):
            for mb in mini_batch_plan(batch, mini, scores, adv, returns, targets, pad_row, cfg, sizes):
                real = int(mb.part.attention_mask.sum()) if mb.scores is not None else 0
                processed += real
                if mb.scores is not None:
                    stats.add("actor/pad_fraction", 1.0 - real / mb.part.attention_mask.numel(), len(mb.part))
                loss = actor_loss(models, mb, cfg, stats)
                skipped += backward_and_step(models.actor, loss, cfg.optim.max_grad_norm, "actor", stats)
                if models.critic is not None:
                    loss = critic_loss(models, mb, cfg, stats)
                    backward_and_step(models.critic, loss, cfg.optim.max_grad_norm, "critic", stats)
    models.generation.sync_weights(models.actor.module)
    return skipped, processed


# ----------------------------------------------------------------------------------------------
# metrics of a rollout, validation


def validate(manager: RolloutManager, cfg: RunConfig, rank: int, world: int) -> dict[str, float]:
    """Success on the fixed validation levels, played by all ranks (each its share), with a 95% CI."""
    t = cfg.trainer
    seeds = manager.seeds.validation(t.val_groups, t.val_group_size)
    share = seeds[rank::world]
    episodes = manager.play_episodes(share, temperature=t.val_temperature)
    counts = [
        sum(ep.success for ep in episodes),
        len(episodes),
        sum(ep.episode_return for ep in episodes),
        sum(len(ep.turns) for ep in episodes),
    ]
    totals = torch.tensor(counts, dtype=torch.float64, device=comm_device())
    dist.all_reduce(totals)  # named reduction: SUM of successes, episodes, returns, turns
    wins, n, total_return, total_turns = totals.cpu().tolist()
    low, high = wilson_interval(int(wins), int(n))
    return {
        "val/success_rate": wins / n,
        "val/success_ci_low": low,
        "val/success_ci_high": high,
        "val/return_mean": total_return / n,
        "val/turns_mean": total_turns / n,
    }


def save(
    run_dir: Path, step: int, models: Models, manager: RolloutManager, state: dict, cfg: RunConfig
) -> None:
    """Checkpoint `step`: engines, the loop's counters and the level-seed schedule."""
    trainer_state = {k: v for k, v in state.items() if k != "step"} | {
        "level_seeds": manager.seeds.state_dict()
    }
    checkpoint.save_checkpoint(
        run_dir,
        step,
        models.actor,
        models.critic,
        models.processor,
        trainer_state,
        cfg.trainer.keep_last,
        state_critic_pair(models),
    )


def state_critic_pair(models: Models) -> tuple[TurnCritic, torch.optim.Optimizer] | None:
    return None if models.state_critic is None else (models.state_critic, models.state_critic_optim)


def restore(path: Path, models: Models, manager: RolloutManager) -> dict[str, Any]:
    """Load a checkpoint into the engines, the seed schedule and the generation engine; its state."""
    state = checkpoint.load_checkpoint(path, models.actor, models.critic, state_critic_pair(models))
    manager.seeds.load_state_dict(state["level_seeds"])
    models.generation.sync_weights(models.actor.module)
    return state


# ----------------------------------------------------------------------------------------------
# the loop


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run `cfg.trainer.steps` iterations (resuming if asked); returns the final summary."""
    rank, world = init_distributed()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    deepspeed.utils.logger.setLevel(logging.WARNING)
    sizes = derived_sizes(cfg, world)
    seed_everything(cfg.trainer.seed, rank)
    run_dir = Path(cfg.trainer.run_dir)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        print(f"[vagen] run folder {run_dir}; {sizes.describe()}", flush=True)
    models = build_models(cfg, sizes)
    threads = torch.get_num_threads()  # after vLLM's CPU worker, which may bind its own
    if rank == 0:  # timed runs: OMP_NUM_THREADS=1 on a 2-core machine halves the CPU the budget buys
        print(f"[vagen] torch threads per rank: {threads} ({os.cpu_count()} CPUs)", flush=True)
    manager = RolloutManager(cfg.env, cfg.rollout, models.generation, models.processor)
    tokenizer = tokenizer_of(models.processor)

    state: dict[str, Any] = {"step": 0, "skipped_steps": 0, "rollbacks": 0, "val_before": None}
    resume = cfg.trainer.resume
    resume_from = (
        checkpoint.latest_checkpoint(run_dir) if resume == "auto" else None if resume == "none" else resume
    )
    if resume_from is not None:
        state = restore(resume_from, models, manager)
        if rank == 0:
            print(f"[vagen] resumed from {resume_from} (step {state['step']})", flush=True)
    logger = MetricsLogger(run_dir, cfg.trainer.steps, state["step"], as_dict(cfg), cfg.logging, rank == 0)
    dist.barrier()  # metrics.jsonl is trimmed to the resumed step before any rank replays it
    alarms = Alarms(cfg.alarms)
    for past in read_metrics(run_dir / "metrics.jsonl"):  # replay: detectors as in an uninterrupted run
        if past["step"] >= 1:
            alarms.update(past)

    if state["val_before"] is None:
        logger.phase("validate")
        state["val_before"] = validate(manager, cfg, rank, world)
        logger.log({"step": 0, **state["val_before"], "time/torch_threads": threads}, advance=False)
    step, batch, stopped, val_after = state["step"], None, False, None
    while step < cfg.trainer.steps and not stopped:
        step += 1
        step_start = time.perf_counter()
        stats = MetricAccumulator()
        timings: dict[str, float] = {}

        # 1. rollout: fresh every `rollout_reuse` steps, else the last batch feeds another update
        if batch is None or (step - 1) % cfg.trainer.rollout_reuse == 0:
            logger.phase("rollout")
            start = time.perf_counter()
            batch = rollout_share(manager, cfg, rank, world).to(models.actor.device)
            timings["time/rollout_s"] = time.perf_counter() - start

            # 2. score, 3. filter, 4. advantages
            logger.phase("score")
            start = time.perf_counter()
            scores = score(models, batch, cfg)
            kept_rows, kept_groups, all_groups = filter_groups(batch, cfg, world)
            kept, kept_scores = batch.select(kept_rows), scores.select(kept_rows)
            plan = None  # mpo: the action targets, from a Q-critic refit on this batch first
            if cfg.algo.policy_loss == "mpo":
                plan = mpo_update_plan(models, kept, kept_scores, cfg, stats)
                adv, returns = plan.advantages, None
            elif len(kept):
                adv, returns = advantages(kept, kept_scores, cfg)
            else:  # the filter dropped every group of this rank: it only runs zero-weight passes
                adv, returns = torch.zeros_like(kept.token_rewards), torch.zeros_like(kept.token_rewards)
            pad_row = batch.select([0])
            timings["time/score_s"] = time.perf_counter() - start
        rollout_metrics(batch, tokenizer, stats, PROMPT_FORMATS[cfg.env.prompt_format].think_parts)
        scoring_metrics(batch, scores, cfg, stats)

        # 5. update
        logger.phase("update")
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + step * 1_009 + rank)
        targets = plan.targets if plan is not None else None
        skipped, tokens = update(
            models, kept, kept_scores, adv, returns, pad_row, cfg, sizes, generator, stats, targets
        )
        if models.state_critic is not None and plan is None:
            states, regression = return_regression(kept, returns, models.state_critic.reads)
            steps = cfg.algo.state_critic_steps
            fit_state_critic(*state_critic_pair(models), states, regression, steps, stats)
        state["skipped_steps"] += skipped
        timings["time/update_s"] = time.perf_counter() - start
        update_tokens = global_sum(tokens)

        # 6. log, alarms, validation, GIFs, checkpoint
        logger.phase("log")
        start = time.perf_counter()
        for key, seconds in timings.items():
            stats.add_max(key, seconds)
        metrics = with_explained_variance({"step": step} | stats.reduce())
        metrics["actor/lr"] = models.actor.get_lr()[0]
        metrics["actor/skipped_steps"] = state["skipped_steps"]  # the skip decision is global (reduced norm)
        metrics["filter/kept_groups"] = kept_groups
        metrics["filter/kept_fraction"] = kept_groups / all_groups
        metrics["time/update_tokens_per_s"] = update_tokens / max(metrics["time/update_s"], 1e-9)
        fired = alarms.update(metrics)
        metrics |= fired
        if step == cfg.trainer.steps or (cfg.trainer.val_every and step % cfg.trainer.val_every == 0):
            logger.phase("validate")
            val_after = validate(manager, cfg, rank, world)
            metrics |= val_after
        if rank == 0 and cfg.trainer.viz_every and step % cfg.trainer.viz_every == 0:
            page = write_step_page(run_dir / "rollouts", step, batch.episodes[: cfg.trainer.viz_episodes])
            logger.log_gifs(sorted(page.parent.glob("*.gif")), step)
        metrics["time/log_s"] = time.perf_counter() - start
        metrics["time/step_s"] = time.perf_counter() - step_start
        logger.log(metrics)

        alarmed = [name for name, on in fired.items() if on]
        for name in alarmed:
            logger.write(f"[vagen] WARNING step {step}: {name} (see docs/metrics.md)")
        if alarmed and cfg.alarms.policy == "stop":
            logger.write(f"[vagen] stopping at step {step}: alarms.policy=stop")
            stopped = True
            continue  # an alarmed step is not checkpointed: resume=auto continues from a healthy one
        elif alarmed and cfg.alarms.policy == "rollback":  # alarmed steps are never saved: last is healthy
            last = checkpoint.latest_checkpoint(run_dir)
            if last is None or state["rollbacks"] >= cfg.alarms.max_rollbacks:
                logger.write(f"[vagen] stopping at step {step}: no rollback left")
                stopped = True
                continue
            rollbacks = state["rollbacks"] + 1
            state = restore(last, models, manager) | {"rollbacks": rollbacks}
            manager.cfg = dataclasses.replace(manager.cfg, seed=cfg.rollout.seed + rollbacks)  # new samples
            step, batch = state["step"], None
            logger.write(f"[vagen] rolled back to {last.name} (rollback {rollbacks})")
            continue

        save_every = cfg.trainer.save_every
        end_of_reuse = step % cfg.trainer.rollout_reuse == 0  # a resume restarts with a fresh rollout
        if step == cfg.trainer.steps or (save_every and step % save_every == 0 and end_of_reuse):
            logger.phase("checkpoint")
            save(run_dir, step, models, manager, state, cfg)

    if val_after is None or stopped:  # stopped early, or resumed at the end: not in metrics.jsonl
        val_after = validate(manager, cfg, rank, world)
    summary = {"steps": step, "val_before": state["val_before"], "val_after": val_after}
    logger.close()
    if rank == 0:
        episodes = cfg.trainer.val_groups * cfg.trainer.val_group_size
        report = end_of_run_report(run_dir, step, episodes, state["val_before"], val_after)
        print("\n".join(report), flush=True)
    return summary
