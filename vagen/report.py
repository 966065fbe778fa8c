"""The short report at the end of a training run: what changed, where to look, what to run next."""

import math
from pathlib import Path

from vagen import checkpoint
from vagen.viz.curves import plot_learning_curve

LEARNING_CURVE_FILE = "learning_curve.png"


def describe_validation(v: dict[str, float]) -> str:
    return f"{v['val/success_rate']:.3f} [{v['val/success_ci_low']:.3f}, {v['val/success_ci_high']:.3f}]"


def end_of_run_report(
    run_dir: str | Path,
    steps: int,
    episodes: int,
    val_before: dict[str, float],
    val_after: dict[str, float],
    algorithm: str = "",
) -> list[str]:
    """Write `<run_dir>/learning_curve.png` and return the report's lines (the algorithm, success
    before/after with 95% CIs and with blank images, the curve, the rollout viewer, and the commands to
    resume, evaluate, or go to a GPU)."""
    run_dir = Path(run_dir)
    config = run_dir / "config.yaml"  # the resolved config: every key, the same run again
    lines = (
        [f"[vagen] algorithm: {algorithm} (where TRICO and the others stand: docs/results.md#the-table)"]
        if algorithm
        else []
    )
    lines.append(
        f"[vagen] validation success ({episodes} episodes): "
        f"before {describe_validation(val_before)} -> after {describe_validation(val_after)}"
    )
    blank = "val/success_rate_blank_image"
    if blank in val_after:
        lines.append(
            f"[vagen] the same levels with blank images: before {val_before.get(blank, math.nan):.3f} -> "
            f"after {val_after[blank]:.3f} (a policy that reads the image loses success here)"
        )
    try:
        curve = plot_learning_curve(run_dir / "metrics.jsonl", run_dir / LEARNING_CURVE_FILE, run_dir.name)
        lines.append(f"[vagen] learning curve: {curve}")
    except ValueError as err:
        lines.append(f"[vagen] no learning curve: {err}")
    viewer = run_dir / "rollouts" / "index.html"
    if viewer.is_file():
        lines.append(f"[vagen] rollout GIFs (open in a browser): {viewer}")
    last = checkpoint.latest_checkpoint(run_dir)
    if last is not None:
        lines += [
            f"[vagen] checkpoints: {checkpoint.checkpoint_root(run_dir)} (newest {last.name})",
            "[vagen] next:",
            f"  continue  python vagen/train.py --config {config} trainer.resume=auto "
            f"trainer.steps={2 * steps}",
            f"  evaluate  python -m vagen.eval --config {config} --checkpoint {last} --episodes 256",
        ]
    else:
        lines.append("[vagen] next:")
    lines.append(
        "  on GPUs   deepspeed vagen/train.py --config configs/sokoban_qwen2_5_vl_3b_trico.yaml "
        "model.path=<local Qwen2.5-VL-3B-Instruct>  (README: GPU recipes)"
    )
    return lines
