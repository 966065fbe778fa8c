"""Evaluation on validation levels: success rate with a Wilson 95% interval, returns, turns, invalid actions,
pass@k, how the episodes ended. `summarize` is a pure function of episode records; `evaluate` plays the
episodes first; `validate` is the trainer's validation, every rank playing its share."""

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from vagen.distributed import comm_device
from vagen.rollout.batch import END_REASONS, EpisodeRecord
from vagen.rollout.manager import RolloutManager


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for the default z).

    centre = (p + z^2 / 2n) / (1 + z^2 / n), half width = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)
    (https://en.wikipedia.org/wiki/Binomial_proportion_confidence_interval#Wilson_score_interval)
    """
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one task from n samples with c successes: 1 - C(n - c, k) / C(n, k)
    (Chen et al. 2021, https://arxiv.org/abs/2107.03374)."""
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


@dataclass
class EvalSummary:
    num_episodes: int
    success_rate: float
    success_ci_low: float
    success_ci_high: float
    mean_return: float
    mean_turns: float
    invalid_action_rate: float  # invalid proposed actions / all proposed actions
    format_error_rate: float  # replies not in the required format / all replies
    pass_at_1: float
    pass_at_k: float  # k = group size: at least one success among the k tries of a level
    k: int
    grounding_f1: float | None = None  # mean <observation> fact F1 over turns (formats that have one)
    # share of episodes per EpisodeRecord.end_reason (success, failure, truncated, max_turns, ...), most first
    end_reasons: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "val/") -> dict[str, float]:
        """Flat scalars: `<prefix><field>`, and `<prefix>end/<reason>` for the shares of `end_reasons`."""
        scalars = {name: value for name, value in asdict(self).items() if name != "end_reasons"}
        flat = {prefix + name: float(value) for name, value in scalars.items() if value is not None}
        return flat | {f"{prefix}end/{reason}": share for reason, share in self.end_reasons.items()}


def summarize(episodes: list[EpisodeRecord]) -> EvalSummary:
    """Metrics of finished episodes; pass@k groups episodes by level seed (k = the smallest group)."""
    if not episodes:
        raise ValueError("no episodes to summarize")
    successes = sum(ep.success for ep in episodes)
    low, high = wilson_interval(successes, len(episodes))
    turns = [turn for ep in episodes for turn in ep.turns]
    proposed = sum(len(t.actions) + t.num_invalid for t in turns)
    by_level: dict[int, list[bool]] = {}
    for ep in episodes:
        by_level.setdefault(ep.level_seed, []).append(ep.success)
    k = min(len(v) for v in by_level.values())
    grounding = [t.grounding for t in turns if t.grounding is not None]
    return EvalSummary(
        num_episodes=len(episodes),
        success_rate=successes / len(episodes),
        success_ci_low=low,
        success_ci_high=high,
        mean_return=sum(ep.episode_return for ep in episodes) / len(episodes),
        mean_turns=len(turns) / len(episodes),
        invalid_action_rate=sum(t.num_invalid for t in turns) / max(proposed, 1),
        format_error_rate=sum(not t.format_ok for t in turns) / max(len(turns), 1),
        pass_at_1=sum(pass_at_k(len(v), sum(v), 1) for v in by_level.values()) / len(by_level),
        pass_at_k=sum(pass_at_k(len(v), sum(v), k) for v in by_level.values()) / len(by_level),
        k=k,
        grounding_f1=sum(grounding) / len(grounding) if grounding else None,
        end_reasons={
            reason: count / len(episodes)
            for reason, count in Counter(ep.end_reason for ep in episodes).most_common()
        },
    )


def evaluate(
    manager: RolloutManager, num_levels: int, group_size: int, temperature: float | None = None
) -> tuple[EvalSummary, list[EpisodeRecord]]:
    """Play `num_levels` validation levels x `group_size` tries each; returns the summary and the episodes."""
    episodes = manager.validation_episodes(num_levels, group_size, temperature)
    return summarize(episodes), episodes


def validate(
    manager: RolloutManager, levels: int, group_size: int, temperature: float, rank: int, world: int
) -> dict[str, float]:
    """val/* metrics on the first `levels` validation levels x `group_size` tries, played by all ranks
    (each its share), with a 95% Wilson interval of the success rate. With images, the same episodes are
    played again with every image blank (`val/success_rate_blank_image`): a policy that reads the image
    loses success there, one on a fixed route does not."""
    share = manager.seeds.validation(levels, group_size)[rank::world]
    episodes = manager.play_episodes(share, temperature=temperature)
    env_errors = manager.env_errors
    blank = [] if manager.env_cfg.text_only else manager.play_episodes(share, temperature, blank_images=True)
    ended = Counter(ep.end_reason for ep in episodes)
    counts = [
        sum(ep.success for ep in episodes),
        len(episodes),
        sum(ep.episode_return for ep in episodes),
        sum(len(ep.turns) for ep in episodes),
        sum(ep.success for ep in blank),
        env_errors + (manager.env_errors if blank else 0),
        *(ended[reason] for reason in END_REASONS),
    ]
    totals = torch.tensor(counts, dtype=torch.float64, device=comm_device())
    # named reduction: SUM of successes, episodes, returns, turns, blank successes, env errors, and the
    # episodes per end reason
    dist.all_reduce(totals)
    wins, n, total_return, total_turns, blank_wins, env_errors, *ends = totals.cpu().tolist()
    low, high = wilson_interval(int(wins), int(n))
    metrics = {
        "val/success_rate": wins / n,
        "val/success_ci_low": low,
        "val/success_ci_high": high,
        "val/return_mean": total_return / n,
        "val/turns_mean": total_turns / n,
        "val/env_errors": env_errors,
    } | {f"val/end/{reason}": count / n for reason, count in zip(END_REASONS, ends, strict=True) if count}
    if not manager.env_cfg.text_only:
        metrics["val/success_rate_blank_image"] = blank_wins / n
    return metrics
