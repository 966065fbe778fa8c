"""The RL loop: rollout -> score -> filter -> advantages -> DeepSpeed update -> log.

`train(cfg)` reads top to bottom in that order. One iteration ("step"):
1. rollout: this rank's share of the G groups x n episodes (the engine generates with the actor's
   current weights: `sync_weights` after every update);
2. score: old log-probs (actor), reference log-probs, values (critic) of the sampled tokens;
3. filter (StarPO-S): keep the groups whose raw returns vary most, ranked over ALL ranks' groups;
4. advantages: the policy update's plan (vagen.updates: `algo.policy_loss`), the state critic's fit on
   the batch (the one place it is fitted), then the plan's last part;
5. update: `ppo_epochs` x `mini_batches` optimizer steps (fixed whatever the filter kept), each
   from the same number of micro-batches on every rank (vagen.batching), `backward` / `step` in the open;
6. log: metrics reduced over ranks, collapse alarms, validation, GIFs, checkpoints.
Start-up (checks before any work, seeds, models) is vagen.startup and vagen.models.build.
"""

import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from envs_visual.language import PROMPT_FORMATS
from vagen import checkpoint
from vagen.algo import GROUP_FILTERS
from vagen.batching import DerivedSizes, MiniBatchTotals, derived_sizes, local_totals, plan_micro_batches
from vagen.config import RunConfig, as_dict, to_yaml
from vagen.critics import fit_state_critic, model_critic_loss, state_values
from vagen.distributed import comm_device, global_sum, init_distributed
from vagen.memory import memory_report
from vagen.metrics import (
    Alarms,
    MetricAccumulator,
    MetricsLogger,
    read_metrics,
    rollout_metrics,
    scoring_metrics,
    with_explained_variance,
)
from vagen.models.build import Models, build_models
from vagen.models.loading import tokenizer_of
from vagen.models.scoring import Scores, token_and_candidate_logprobs, token_logprobs, token_values
from vagen.optim import backward_and_step, deepspeed_config
from vagen.report import end_of_run_report
from vagen.rollout.batch import RolloutBatch
from vagen.rollout.evaluate import validate
from vagen.rollout.manager import RolloutManager, fit_env_to_model
from vagen.startup import check_run, quiet_libraries, seed_everything
from vagen.updates import POLICY_UPDATES, Plan, PolicyUpdate, actor_loss
from vagen.viz.html import write_step_page

# ----------------------------------------------------------------------------------------------
# the stages of one iteration


def rollout_share(manager: RolloutManager, cfg: RunConfig, rank: int, world: int) -> RolloutBatch:
    """Every rank draws the same next G training levels and plays its own slice of the groups."""
    seeds = manager.seeds.next_train(cfg.rollout.num_groups, cfg.rollout.group_size)
    per_rank = len(seeds) // world
    return manager.collect(seeds[rank * per_rank : (rank + 1) * per_rank], training=True)


@torch.no_grad()
def score(models: Models, batch: RolloutBatch, cfg: RunConfig) -> Scores:
    """Old and reference log-probs (and the actor's of every action token where the update reads them),
    entropies, and a V critic's values, at the temperature the tokens were sampled with."""
    args = (batch.input_ids, batch.attention_mask, batch.vision, cfg.trainer.score_micro_batch_size)
    temperature = cfg.rollout.temperature
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
    elif models.state_critic is not None and models.state_critic.outputs == 1:  # a Q critic scores no token
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
    kept = GROUP_FILTERS[cfg.algo.filter.rule](all_returns, all_groups.long(), cfg.algo.filter.keep)
    first = dist.get_rank() * len(batch.episodes)
    kept_local = kept[(kept >= first) & (kept < first + len(batch.episodes))] - first
    rows = torch.isin(batch.episode_ids.cpu(), kept_local).nonzero().flatten()
    return rows, int(torch.unique(all_groups[kept]).numel()), int(torch.unique(all_groups).numel())


def plan_update(
    update: PolicyUpdate, models: Models, batch: RolloutBatch, scores: Scores, cfg: RunConfig,
    stats: MetricAccumulator,
) -> Plan:  # fmt: skip
    """The update's plan for the kept batch; the state critic, if the run has one, is fitted here on the
    regression the plan names (a V critic on the estimator's returns, mpo's Q critic by expected SARSA)."""
    plan = update.prepare(models, batch, scores, cfg, stats)
    if models.state_critic is not None:
        critic, optim = models.state_critic, models.state_critic_optim
        steps = cfg.algo.state_critic_steps
        fit_state_critic(critic, optim, plan.critic_inputs, plan.critic_regression, steps, stats)
    return update.finish(models, plan, cfg, stats)


def optimize(
    update: PolicyUpdate, models: Models, batch: RolloutBatch, scores: Scores, plan: Plan,
    pad_row: RolloutBatch, cfg: RunConfig, sizes: DerivedSizes, generator: torch.Generator,
    stats: MetricAccumulator,
) -> tuple[int, int]:  # fmt: skip
    """ppo_epochs x mini_batches optimizer steps of the actor (and model critic), same count on every rank.

    Returns (actor steps skipped by the gradient guard, real tokens processed on this rank).
    """
    skipped = processed = 0
    units = update.policy_units(batch, plan, cfg)  # (B,)
    skip_norm = cfg.optim.skip_grad_norm
    for _ in range(cfg.algo.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for mini in order.tensor_split(cfg.algo.mini_batches):
            local = torch.tensor(local_totals(batch, mini, units), dtype=torch.float64, device=comm_device())
            dist.all_reduce(local)  # named reduction: SUM of the mini-batch's loss units over ranks
            totals = MiniBatchTotals(*local.tolist())
            micro = plan_micro_batches(
                batch, mini, scores, plan.advantages, plan.returns, plan.targets, units, totals, pad_row,
                cfg.trainer.micro_batch_size, sizes.micro_batches_per_step, sizes.world_size,
            )  # fmt: skip
            for mb in micro:
                if mb.scores is not None:
                    real = int(mb.part.attention_mask.sum())
                    processed += real
                    stats.add("actor/pad_fraction", 1.0 - real / mb.part.attention_mask.numel(), len(mb.part))
                loss = actor_loss(update, models, mb, cfg, stats)
                norm, was_skipped = backward_and_step(models.actor, loss, skip_norm)
                if norm is not None:
                    stats.add("actor/grad_norm", norm if math.isfinite(norm) else 0.0)
                skipped += int(was_skipped)
                if models.critic is not None:
                    loss = model_critic_loss(models.critic.module, mb, cfg.algo.vf_clip, stats)
                    norm, _ = backward_and_step(models.critic, loss, skip_norm)
                    if norm is not None:
                        stats.add("critic/grad_norm", norm if math.isfinite(norm) else 0.0)
    models.generation.sync_weights(models.actor.module)
    return skipped, processed


# ----------------------------------------------------------------------------------------------
# checkpoints


def save(
    run_dir: Path, step: int, models: Models, manager: RolloutManager, state: dict, cfg: RunConfig
) -> None:
    """Checkpoint `step`: engines, the loop's counters and the level-seed schedule."""
    trainer_state = {k: v for k, v in state.items() if k != "step"} | {
        "level_seeds": manager.seeds.state_dict()
    }
    checkpoint.save_checkpoint(
        run_dir, step, models.actor, models.critic, models.processor, trainer_state, cfg.trainer.keep_last,
        state_critic_pair(models),
    )  # fmt: skip


def state_critic_pair(models: Models) -> tuple[Any, torch.optim.Optimizer] | None:
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
    """Run `cfg.trainer.steps` iterations (resuming if asked); returns the final summary.

    Raises ConfigError (vagen.startup.check_run) before anything is written if an input is bad."""
    check_run(cfg)
    fit_env_to_model(cfg.env, cfg.model.path)
    rank, world = init_distributed()
    quiet_libraries()
    sizes = derived_sizes(cfg, world)
    update = POLICY_UPDATES[cfg.algo.policy_loss]
    seed_everything(cfg.trainer.seed, rank)
    run_dir = Path(cfg.trainer.run_dir)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        print(f"[vagen] run folder {run_dir}; {sizes.describe()}", flush=True)
        for line in memory_report(cfg, deepspeed_config(cfg, sizes), world, update.critic(cfg) == "model"):
            print(f"[vagen] {line}", flush=True)
    models = build_models(cfg, sizes, update)
    threads = torch.get_num_threads()  # after vLLM's CPU worker, which may bind its own
    if rank == 0:  # timed runs: OMP_NUM_THREADS=1 on a 2-core machine halves the CPU the budget buys
        print(f"[vagen] torch threads per rank: {threads} ({os.cpu_count()} CPUs)", flush=True)
    manager = RolloutManager(cfg.env, cfg.rollout, models.generation, models.processor, seed=cfg.trainer.seed)
    tokenizer = tokenizer_of(models.processor)
    t = cfg.trainer
    validation = (t.val_groups, t.val_group_size, t.val_temperature, rank, world)

    state: dict[str, Any] = {"step": 0, "skipped_steps": 0, "rollbacks": 0, "val_before": None}
    resume_from = {"auto": checkpoint.latest_checkpoint(run_dir), "none": None}.get(t.resume, t.resume)
    if resume_from is not None:
        state = restore(Path(resume_from), models, manager)
        if rank == 0:
            print(f"[vagen] resumed from {resume_from} (step {state['step']})", flush=True)
    logger = MetricsLogger(run_dir, t.steps, state["step"], as_dict(cfg), cfg.logging, rank == 0)
    dist.barrier()  # metrics.jsonl is trimmed to the resumed step before any rank replays it
    alarms = Alarms()
    for past in read_metrics(run_dir / "metrics.jsonl"):  # replay: detectors as in an uninterrupted run
        if past["step"] >= 1:
            alarms.update(past)

    if state["val_before"] is None:
        logger.phase("validate")
        state["val_before"] = validate(manager, *validation)
        logger.log({"step": 0, **state["val_before"], "time/torch_threads": threads}, advance=False)
    step, stopped, val_after = state["step"], False, None
    while step < t.steps and not stopped:
        step += 1
        step_start = time.perf_counter()
        stats = MetricAccumulator()
        timings: dict[str, float] = {}

        # 1. rollout
        logger.phase("rollout")
        start = time.perf_counter()
        batch = rollout_share(manager, cfg, rank, world).to(models.actor.device)
        timings["time/rollout_s"] = time.perf_counter() - start

        # 2. score, 3. filter, 4. advantages (and the state critic's fit)
        logger.phase("score")
        start = time.perf_counter()
        scores = score(models, batch, cfg)
        kept_rows, kept_groups, all_groups = filter_groups(batch, cfg, world)
        kept, kept_scores = batch.select(kept_rows), scores.select(kept_rows)
        plan = plan_update(update, models, kept, kept_scores, cfg, stats)
        timings["time/score_s"] = time.perf_counter() - start
        rollout_metrics(batch, tokenizer, stats, PROMPT_FORMATS[cfg.env.prompt_format].think_parts)
        stats.add_sum("rollout/env_errors", manager.env_errors)
        scoring_metrics(batch, scores, cfg, stats)

        # 5. update
        logger.phase("update")
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(t.seed * 1_000_003 + step * 1_009 + rank)
        pad_row = batch.select([0])
        skipped, tokens = optimize(
            update, models, kept, kept_scores, plan, pad_row, cfg, sizes, generator, stats
        )
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
        if step == t.steps or (t.val_every and step % t.val_every == 0):
            logger.phase("validate")
            val_after = validate(manager, *validation)
            metrics |= val_after
        if rank == 0 and t.viz_every and step % t.viz_every == 0:
            page = write_step_page(run_dir / "rollouts", step, batch.episodes[: t.viz_episodes])
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
            manager.seed = t.seed + rollbacks  # new samples from the same levels
            step = state["step"]
            logger.write(f"[vagen] rolled back to {last.name} (rollback {rollbacks})")
            continue

        if step == t.steps or (t.save_every and step % t.save_every == 0):
            logger.phase("checkpoint")
            save(run_dir, step, models, manager, state, cfg)

    if val_after is None or stopped:  # stopped early, or resumed at the end: not in metrics.jsonl
        val_after = validate(manager, *validation)
    summary = {"steps": step, "val_before": state["val_before"], "val_after": val_after}
    logger.close()
    if rank == 0:
        episodes = t.val_groups * t.val_group_size
        algorithm = update.describe(cfg)
        report = end_of_run_report(run_dir, step, episodes, state["val_before"], val_after, algorithm)
        print("\n".join(report), flush=True)
    return summary
