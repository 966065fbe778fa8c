"""Metrics: reduction across ranks, the console / metrics.jsonl / wandb sinks, and collapse alarms.

Every key lives in a fixed namespace (train/, actor/, critic/, filter/, val/, time/, alarm/) and
is defined in docs/metrics.md. Only rank 0 writes anything.
"""

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from tqdm import tqdm

from vagen.algo import kl, masked_entropy_mean, masked_mean, mean_group_return_std, template_score
from vagen.algo.diagnostics import CollapseDetector
from vagen.algo.losses import MIN_RETURN_VARIANCE
from vagen.config import LoggingConfig, RunConfig
from vagen.rollout.batch import RolloutBatch


class MetricAccumulator:
    """Per-rank weighted sums; `reduce()` turns them into means (or maxima) over all ranks.

    add(key, value, weight): contributes value * weight to the sum and weight to the count, so the
    reduced value is sum_ranks sum_i w_i v_i / sum_ranks sum_i w_i (a mean over all items of all
    ranks, not a mean of per-rank means). A key with total weight 0 reduces to 0.
    add_max(key, value): the reduced value is the maximum over ranks (timings).
    add_sum(key, value): the reduced value is the sum over ranks (counts).
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.maxima: dict[str, float] = {}
        self.totals: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self.sums[key] += float(value) * weight
        self.weights[key] += weight

    def add_max(self, key: str, value: float) -> None:
        self.maxima[key] = max(self.maxima.get(key, -math.inf), float(value))

    def add_sum(self, key: str, value: float) -> None:
        self.totals[key] += float(value)

    def reduce(self) -> dict[str, float]:
        """Collective when distributed: every rank calls it once per step."""
        mean_keys, max_keys, sum_keys = sorted(self.sums), sorted(self.maxima), sorted(self.totals)
        if dist.is_initialized() and dist.get_world_size() > 1:
            # the key sets may differ between ranks (e.g. one rank filtered everything): take the union
            all_keys: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(all_keys, (mean_keys, max_keys, sum_keys))
            mean_keys, max_keys, sum_keys = (
                sorted({k for keys in all_keys for k in keys[i]}) for i in range(3)
            )
        sums = torch.tensor(
            [[self.sums.get(k, 0.0), self.weights.get(k, 0.0)] for k in mean_keys], dtype=torch.float64
        )
        maxima = torch.tensor([self.maxima.get(k, -math.inf) for k in max_keys], dtype=torch.float64)
        totals = torch.tensor([self.totals.get(k, 0.0) for k in sum_keys], dtype=torch.float64)
        device = torch.device(get_accelerator().current_device_name())  # nccl needs GPU tensors
        sums, maxima, totals = sums.to(device), maxima.to(device), totals.to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)  # named reduction: weighted sums and weights
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)  # named reduction: slowest rank's timings
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)  # named reduction: counts of all ranks
        out = {k: (s / w if w > 0 else 0.0) for k, (s, w) in zip(mean_keys, sums.cpu().tolist(), strict=True)}
        out |= dict(zip(max_keys, maxima.cpu().tolist(), strict=True))
        out |= dict(zip(sum_keys, totals.cpu().tolist(), strict=True))
        return out


# token-weighted moments of the returns R and the residuals R - V, summed over a step's micro-batches
VALUE_MOMENTS = (
    "critic/returns_mean",
    "critic/returns_sq_mean",
    "critic/residual_mean",
    "critic/residual_sq_mean",
)


def add_value_moments(
    stats: MetricAccumulator, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> None:
    """Add one micro-batch's E[R], E[R^2], E[R - V], E[(R - V)^2] over the masked tokens (weight: tokens),
    so that `with_explained_variance` can compute the explained variance over the whole step."""
    mask = mask.bool()
    returns, residual = returns[mask].double(), (returns - values)[mask].double()
    tokens = int(mask.sum())
    for key, x in zip(VALUE_MOMENTS, (returns, returns**2, residual, residual**2), strict=True):
        stats.add(key, x.mean().item() if tokens else 0.0, tokens)


def with_explained_variance(metrics: dict[str, float]) -> dict[str, float]:
    """Replace the VALUE_MOMENTS by critic/explained_var = 1 - Var[R - V] / Var[R] over every value token
    of the step (all micro-batches and ranks; 0 when Var[R] <= MIN_RETURN_VARIANCE), keeping
    critic/returns_mean. Per micro-batch it would mislead: micro-batches group rows of similar length,
    whose returns often do not vary at all."""
    if VALUE_MOMENTS[0] not in metrics:
        return metrics
    out = dict(metrics)
    r_mean, r_sq, res_mean, res_sq = (out.pop(key) for key in VALUE_MOMENTS)
    returns_var, residual_var = r_sq - r_mean**2, res_sq - res_mean**2
    explained = 1.0 - residual_var / returns_var if returns_var > MIN_RETURN_VARIANCE else 0.0
    return out | {"critic/returns_mean": r_mean, "critic/explained_var": explained}


def rollout_metrics(
    batch: RolloutBatch, tokenizer, stats: MetricAccumulator, think_parts: tuple[str, ...] | None = None
) -> None:
    """train/* metrics of this rank's episodes, weighted so that the reduction averages all ranks.
    `think_parts`: the prompt format's <think> elements (its F1 metrics exist on every rank alike)."""
    groups, returns, success = batch.episode_outcomes()
    episodes, turns = batch.episodes, [t for ep in batch.episodes for t in ep.turns]
    stats.add("train/success_rate", success.float().mean().item(), len(episodes))
    stats.add("train/return_mean", returns.mean().item(), len(episodes))
    stats.add(
        "train/return_std_in_group", mean_group_return_std(returns, groups).item(), len(set(groups.tolist()))
    )
    stats.add("train/turns_mean", len(turns) / len(episodes), len(episodes))
    proposed = sum(t.num_invalid + len(t.actions) for t in turns)
    stats.add("train/invalid_action_rate", sum(t.num_invalid for t in turns) / max(proposed, 1), proposed)
    stats.add("train/format_ok_rate", sum(t.format_ok for t in turns) / max(len(turns), 1), len(turns))
    stats.add("train/response_tokens", sum(t.num_tokens for t in turns) / max(len(turns), 1), len(turns))
    for key, tag, field_name in (
        ("train/grounding_f1", "observation", "grounding"),
        ("train/worldmodel_f1", "prediction", "worldmodel"),
    ):
        if tag in (think_parts or ()):
            scored = [getattr(t, field_name) or 0.0 for t in turns]  # a malformed reply scores 0
            stats.add(key, sum(scored) / len(scored), len(scored))
    think = [(t.texts.get("think", ""), t.state) for ep in episodes for t in ep.turns]
    think_tokens = sum(len(tokenizer(text, add_special_tokens=False).input_ids) for text, _ in think)
    stats.add("train/think_tokens", think_tokens / max(len(turns), 1), len(turns))
    written = [(text, key) for text, key in think if text.strip()]  # replies without a <think> say nothing
    template = template_score([text for text, _ in written], [key for _, key in written])
    stats.add("train/template_score", template.cross_state_overlap, template.num_pairs)


def scoring_metrics(batch: RolloutBatch, scores, cfg: RunConfig, stats: MetricAccumulator) -> None:
    """actor/entropy and actor/kl of the policy at rollout time (`scores`: vagen.trainer.Scores), and
    rollout/logprob_gap: mean |engine log-prob - trainer log-prob| of the sampled tokens, which is large
    when the engine samples from other weights or other inputs than the trainer scores."""
    tokens = batch.loss_mask.sum().item()
    stats.add("actor/entropy", masked_entropy_mean(scores.entropy, batch.loss_mask).item(), tokens)
    gap = (batch.rollout_logprobs.to(scores.old_logp.device) - scores.old_logp).abs()
    stats.add("rollout/logprob_gap", masked_mean(gap, batch.loss_mask).item(), tokens)
    if scores.ref_logp is not None:
        ref_kl = masked_mean(kl(scores.old_logp, scores.ref_logp, cfg.algo.kl_kind), batch.loss_mask)
        stats.add("actor/kl", ref_kl.item(), tokens)


# metric -> (alarm name, which flags fire it): the RAGEN collapse signs (arXiv:2504.20073)
ALARM_WATCHES = {
    "train/return_std_in_group": ("alarm/return_std_collapse", ("drop",)),
    "actor/entropy": ("alarm/entropy_swing", ("spike", "drop")),
    "actor/grad_norm": ("alarm/grad_norm_spike", ("spike",)),
    "train/template_score": ("alarm/template_rise", ("spike",)),
    "train/format_ok_rate": ("alarm/format_collapse", ("drop",)),  # replies drift out of the format
}


class Alarms:
    """One CollapseDetector per watched metric (its default thresholds: a spike is 3x the running median
    of the last 20 steps after 5 of them, a drop stays below half the running max for 5 steps);
    `update` returns alarm/* metrics (1.0 = fired)."""

    def __init__(self) -> None:
        self.detectors = {key: CollapseDetector() for key in ALARM_WATCHES}

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        fired = {}
        for key, (alarm, kinds) in ALARM_WATCHES.items():
            if key not in metrics:
                continue
            flags = self.detectors[key].update(metrics[key])
            fired[alarm] = float(any(getattr(flags, kind) for kind in kinds))
        return fired


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """All lines of a metrics.jsonl file."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLogger:
    """Console progress bar, `<run_dir>/metrics.jsonl` (one JSON line per step) and optional wandb.

    On resume from step s, lines with step > s (written by the interrupted run) are dropped first.
    """

    POSTFIX = {
        "train/success_rate": "succ",
        "train/return_mean": "ret",
        "actor/pg_loss": "pg",
        "actor/entropy": "ent",
        "time/step_s": "s/it",
    }

    def __init__(
        self,
        run_dir: str | Path,
        total_steps: int,
        resumed_step: int,
        config: dict[str, Any],
        cfg: LoggingConfig,
        is_main: bool,
    ) -> None:
        self.is_main = is_main
        self.path = Path(run_dir) / "metrics.jsonl"
        self.wandb_run = None
        if not is_main:
            return
        kept = [m for m in read_metrics(self.path) if m["step"] <= resumed_step]
        self.path.write_text("".join(json.dumps(m) + "\n" for m in kept))
        self.bar = tqdm(total=total_steps, initial=resumed_step, desc="train", unit="it", dynamic_ncols=True)
        if cfg.wandb:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")  # wandb's own variables choose: offline by default
            self.wandb_run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "vagen"),
                name=Path(run_dir).name,
                id=Path(run_dir).name,
                resume="allow",
                dir=str(run_dir),
                config=config,
            )

    def log(self, metrics: dict[str, float], advance: bool = True) -> None:
        """Write one step's metrics (must contain `step`)."""
        if not self.is_main:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in metrics.items() if k != "step"}, step=int(metrics["step"]))
        shown = {short: f"{metrics[key]:.3g}" for key, short in self.POSTFIX.items() if key in metrics}
        if shown:
            self.bar.set_postfix(shown, refresh=False)
        if advance:
            self.bar.update(1)

    def phase(self, name: str) -> None:
        """Show what the current iteration is doing (rollout, score, update, ...)."""
        if self.is_main:
            self.bar.set_description(name)

    def write(self, line: str) -> None:
        """A console line that does not break the progress bar."""
        if self.is_main:
            tqdm.write(line)

    def log_gifs(self, paths: list[Path], step: int) -> None:
        if self.is_main and self.wandb_run is not None and paths:
            import wandb

            videos = {f"rollout/episode_{i}": wandb.Video(str(p), format="gif") for i, p in enumerate(paths)}
            self.wandb_run.log(videos, step=step)

    def close(self) -> None:
        if self.is_main:
            self.bar.close()
            if self.wandb_run is not None:
                self.wandb_run.finish()
