"""Evaluate a policy on the validation levels: success with its 95% CI, return, turns, how episodes end, GIFs.

    python -m vagen.eval --config configs/frozenlake_tiny.yaml \
        --checkpoint runs/frozenlake_tiny/checkpoints/step_000020 --episodes 256
    python -m vagen.eval --config configs/frozenlake_tiny.yaml   # the base model: the "before" number

Without --checkpoint the config's `model.path` is evaluated. A checkpoint's `actor/` folder is a
save_pretrained directory (or a LoRA adapter on `model.path`). Extra arguments are dotted config
overrides (e.g. rollout.engine=vllm). One process; levels are the fixed validation seeds.
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vagen.config import RunConfig, load_config_or_exit

if TYPE_CHECKING:
    from vagen.rollout.manager import RolloutManager


def load_actor(cfg: RunConfig, checkpoint: Path | None):
    """(model, processor): the model RL starts from (`model.path` or its warm start), a checkpoint's
    full weights, or its LoRA adapter on that start."""
    from vagen.models.loading import load_policy, load_processor
    from vagen.pretrain import warm_start_model

    m = cfg.model
    load = dict(
        dtype=m.dtype, attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code
    )
    start = warm_start_model(cfg)
    if checkpoint is None:
        return load_policy(start, **load)
    actor_dir = checkpoint / "actor"
    if not actor_dir.is_dir():
        raise FileNotFoundError(f"{checkpoint} has no actor/ folder; pass runs/<run>/checkpoints/step_N")
    if (actor_dir / "adapter_config.json").is_file():
        from peft import PeftModel

        base, _ = load_policy(start, **load)
        return PeftModel.from_pretrained(base, actor_dir).merge_and_unload(), load_processor(start)
    return load_policy(actor_dir, **load)


def evaluation_manager(cfg: RunConfig, checkpoint: Path | None = None) -> "RolloutManager":
    """A RolloutManager that plays the actor of `load_actor` (in eval mode) with the config's engine."""
    from vagen.rollout.engines import make_engine
    from vagen.rollout.manager import RolloutManager, fit_env_to_model

    fit_env_to_model(cfg.env, cfg.model.path)
    model, processor = load_actor(cfg, checkpoint)
    model.eval()
    engine = make_engine(cfg.rollout.engine, model, processor, cfg.rollout)
    return RolloutManager(cfg.env, cfg.rollout, engine, processor, seed=cfg.trainer.seed)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the run's YAML config (env, rollout, model)")
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="runs/<run>/checkpoints/step_N (default: base)"
    )
    parser.add_argument("--episodes", type=int, default=256, help="validation episodes to play")
    parser.add_argument("--group-size", type=int, default=1, help="tries per level (pass@k uses k = this)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--gifs", type=int, default=8, help="episodes written as GIFs (+ an HTML index)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <checkpoint>/eval)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args(argv)
    cfg = load_config_or_exit(args.config, args.overrides)
    if args.episodes < 1 or args.group_size < 1 or args.episodes % args.group_size:
        sys.exit(
            f"--episodes ({args.episodes}) must be a positive multiple of --group-size ({args.group_size})"
        )

    from vagen.rollout.evaluate import evaluate
    from vagen.viz.html import write_step_page

    torch.manual_seed(cfg.trainer.seed)
    manager = evaluation_manager(cfg, args.checkpoint)
    summary, episodes = evaluate(manager, args.episodes // args.group_size, args.group_size, args.temperature)

    out = args.out or (
        args.checkpoint / "eval" if args.checkpoint else Path(cfg.trainer.run_dir) / "eval_base"
    )
    out.mkdir(parents=True, exist_ok=True)
    page = write_step_page(out, 0, episodes[: args.gifs], title="evaluation") if args.gifs else None
    teacher = cfg.warm_start.teacher
    base = cfg.model.path + (f" ({teacher} warm start)" if teacher != "none" else "")
    result = {"checkpoint": str(args.checkpoint) if args.checkpoint else base, **asdict(summary)}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['checkpoint']}: success {summary.success_rate:.3f} "
        f"[95% CI {summary.success_ci_low:.3f}, {summary.success_ci_high:.3f}] "
        f"over {summary.num_episodes} episodes, "
        f"mean return {summary.mean_return:.3f}, mean turns {summary.mean_turns:.2f}, "
        f"invalid actions {summary.invalid_action_rate:.3f}, pass@{summary.k} {summary.pass_at_k:.3f}"
    )
    ends = summary.end_reasons.items()
    print("episodes ended: " + ", ".join(f"{reason} {share:.3f}" for reason, share in ends))
    print(f"summary: {out / 'summary.json'}" + (f"; GIFs: {page}" if page else ""))
    return result


if __name__ == "__main__":
    main()
