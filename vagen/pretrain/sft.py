"""Warm starts by supervised fine-tuning on teacher-played conversations.

    python -m vagen.pretrain.sft --config configs/frozenlake_tiny.yaml [--teacher TEACHER] [--out DIR]

TEACHER: format | grounded | grid | solver | planner (vagen.pretrain.teachers; default warm_start.teacher).

1. Play `warm_start.episodes` episodes on training levels (the seed schedule of `warm_start.seed`, so that
   RL runs of any seed share the warm start; validation layouts stay held out) with the teacher writing
   the replies.
2. Assemble them with the RL rollout's own code (same chat template, window, loss mask); the replies
   are tokenised from the teacher's text.
3. Train on the masked token cross-entropy (vagen.pretrain.supervised, `warm_start.optim`).
4. Evaluate on the validation levels (success with a Wilson CI, reply-format rate), and write the
   model + processor to `$VAGEN_CACHE/sft/<teacher>-<key>`, the key hashing the base model, teacher,
   env and rollout config (less NOT_IN_CACHE_KEY) and the training procedure: a second call with the
   same inputs is instant.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vagen.config import TEACHERS, EnvConfig, RolloutConfig, WarmStartConfig, load_config_or_exit
from vagen.models.loading import load_policy
from vagen.models.tiny import cache_root, resolve_model_path
from vagen.pretrain.perception import start_model
from vagen.pretrain.supervised import cached_report, inputs_key, save_atomically, train_supervised
from vagen.pretrain.teachers import optimal_success, play_teacher_episodes, teacher_available, teacher_success
from vagen.rollout.assembly import ChatCodec
from vagen.rollout.batch import build_batch
from vagen.rollout.engines import make_engine
from vagen.rollout.evaluate import EvalSummary, evaluate
from vagen.rollout.manager import (
    RolloutManager,
    fit_env_to_model,
    make_language_env,
    read_chat_template,
    seed_schedule,
)


@dataclass
class SFTResult:
    """Where the warm start is, and what it measured (rates over the validation levels)."""

    model_dir: Path
    report: dict


def evaluate_policy(
    model, processor, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, cfg: WarmStartConfig
) -> EvalSummary:
    """Success (Wilson CI) and format errors on the first `eval_levels` validation levels, one try each,
    sampled at the rollout's temperature."""
    engine = make_engine("hf", model, processor)
    manager = RolloutManager(env_cfg, rollout_cfg, engine, processor, seed=cfg.seed)
    summary, _ = evaluate(manager, cfg.eval_levels, 1)
    return summary


def describe(summary: EvalSummary) -> dict[str, float]:
    return {
        "success": summary.success_rate,
        "success_ci": [summary.success_ci_low, summary.success_ci_high],
        "format_ok": 1.0 - summary.format_error_rate,
        "invalid_action_rate": summary.invalid_action_rate,
        **({} if summary.grounding_f1 is None else {"grounding_f1": summary.grounding_f1}),
    }


# Fields that change neither the teacher's conversations nor the training: reward weights (the loss is
# cross-entropy; only the report's mean return is in the rewards of the run that built the cache), and
# the RL rollout's engine, batch shape, exploring starts and loss spans (the teacher rows take them all).
NOT_IN_CACHE_KEY = {
    "env": {"format_reward", "format_penalty", "grounding_reward_weight", "worldmodel_reward_weight"},
    "rollout": {"engine", "num_groups", "group_size", "random_start", "loss_spans", "adv_spans"},
    "warm_start": set(),
}


def cache_key(model_path: Path, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, cfg: WarmStartConfig) -> str:
    """inputs_key over the base model and the env, rollout and warm-start configs, less NOT_IN_CACHE_KEY."""
    configs = {"env": env_cfg, "rollout": rollout_cfg, "warm_start": cfg}
    return inputs_key(
        model_path,
        {
            name: {k: v for k, v in asdict(section).items() if k not in NOT_IN_CACHE_KEY[name]}
            for name, section in configs.items()
        },
    )


def warm_start_dir(
    model_path: str, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, cfg: WarmStartConfig
) -> Path:
    """The cache folder this warm start is (or will be) written to."""
    key = cache_key(resolve_model_path(model_path), env_cfg, rollout_cfg, cfg)
    return cache_root() / "sft" / f"{cfg.teacher}-{key}"


def run_sft(
    model_path: str,
    env_cfg: EnvConfig,
    rollout_cfg: RolloutConfig,
    cfg: WarmStartConfig,
    out_dir: str | Path | None = None,
    log=print,
) -> SFTResult:
    """The whole warm start (module docstring) with teacher `cfg.teacher`; returns the cached result when
    it exists."""
    if cfg.teacher not in TEACHERS:
        raise ValueError(f"warm_start.teacher must be one of {TEACHERS}, got {cfg.teacher!r}")
    key = cache_key(resolve_model_path(model_path), env_cfg, rollout_cfg, cfg)
    target = Path(out_dir) if out_dir is not None else cache_root() / "sft" / f"{cfg.teacher}-{key}"
    report = cached_report(target)
    if report is not None and report.get("cache_key") == key:  # an --out folder may hold another one
        log(f"warm start cached: {target}")
        return SFTResult(target, report)
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, processor = load_policy(model_path)
    codec = ChatCodec(processor, read_chat_template(rollout_cfg.chat_template))
    seeds = seed_schedule(env_cfg, cfg.seed)  # validation layouts held out
    train_seeds = seeds.next_train(cfg.episodes, 1)
    records, segments = play_teacher_episodes(env_cfg, rollout_cfg, codec, train_seeds, cfg.teacher, cfg.seed)
    data = build_batch(segments, records, codec.pad_token_id)
    val_seeds = seeds.validation(cfg.eval_levels, 1)
    game = make_language_env(env_cfg, local=True).env.unwrapped
    references = {
        t: teacher_success(env_cfg, rollout_cfg, val_seeds, t) for t in TEACHERS if teacher_available(game, t)
    }
    references["optimal"] = optimal_success(env_cfg, rollout_cfg, val_seeds)
    data_seconds = time.perf_counter() - started
    log(
        f"warm start data: {len(data.episodes)} {cfg.teacher}-teacher episodes, {len(data)} rows, "
        f"{int(data.loss_mask.sum())} loss tokens ({data_seconds:.1f}s); teacher success on validation: "
        + ", ".join(f"{t} {rate}" for t, rate in references.items())
    )
    start_train = time.perf_counter()
    losses = train_supervised(model, data, cfg.optim, cfg.seed, log)
    train_seconds = time.perf_counter() - start_train
    after = describe(evaluate_policy(model, processor, env_cfg, rollout_cfg, cfg))
    report = {
        "cache_key": key,
        "teacher": cfg.teacher,
        "base_model": str(model_path),
        "after": after,
        "teacher_success": references,
        "teacher_success_on_data": float(np.mean([record.success for record in records])),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": {"data": data_seconds, "train": train_seconds, "total": time.perf_counter() - started},
        "warm_start": asdict(cfg),
    }
    log(f"warm start: {after}")
    save_atomically(model, processor, report, target)
    return SFTResult(target, report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML run config (configs/*.yaml)")
    parser.add_argument("--teacher", choices=TEACHERS, default=None, help="overrides warm_start.teacher")
    parser.add_argument("--out", default=None, help="write the model here instead of the cache")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. warm_start.optim.steps=300")
    args = parser.parse_args(argv)
    cfg = load_config_or_exit(args.config, args.overrides)
    fit_env_to_model(cfg.env, cfg.model.path)
    warm = cfg.warm_start if args.teacher is None else replace(cfg.warm_start, teacher=args.teacher)
    if warm.teacher == "none":
        raise SystemExit("config error: warm_start.teacher is none: pass --teacher or set it")
    result = run_sft(start_model(cfg), cfg.env, cfg.rollout, warm, args.out)
    print(json.dumps({"model_dir": str(result.model_dir), **result.report}, indent=2))


if __name__ == "__main__":
    main()
