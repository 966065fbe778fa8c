"""Learning curves of one run from its metrics.jsonl: the PNG `make train` points to at the end.

Left: validation success (greedy, held-out levels) with its 95% CI band, and the training batch's
success. Right: the mean token entropy of the policy's replies, the first thing to look at when the
success stops moving (docs/metrics.md).
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vagen.metrics import read_metrics  # noqa: E402


def series(metrics: list[dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of every line that has `key`, in step order."""
    lines = sorted((m for m in metrics if key in m), key=lambda m: m["step"])
    return [int(m["step"]) for m in lines], [m[key] for m in lines]


def plot_learning_curve(metrics_file: str | Path, out: str | Path, title: str = "") -> Path:
    """Write the run's learning-curve PNG to `out`; raises ValueError when there is nothing to plot."""
    metrics = read_metrics(metrics_file)
    val_steps, val_success = series(metrics, "val/success_rate")
    train_steps, train_success = series(metrics, "train/success_rate")
    if not val_steps and not train_steps:
        raise ValueError(f"{metrics_file} has no success metrics to plot")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if train_steps:
        left.plot(train_steps, train_success, color="tab:gray", alpha=0.5, linewidth=1, label="train batch")
    if val_steps:
        _, low = series(metrics, "val/success_ci_low")
        _, high = series(metrics, "val/success_ci_high")
        left.plot(val_steps, val_success, marker="o", color="tab:blue", label="validation (greedy)")
        if len(low) == len(val_steps) == len(high):
            left.fill_between(val_steps, low, high, color="tab:blue", alpha=0.15, label="95% CI")
    left.set(xlabel="step", ylabel="success rate", ylim=(-0.02, 1.02), title=title or "success")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="upper left")
    entropy_steps, entropy = series(metrics, "actor/entropy")
    right.plot(entropy_steps, entropy, color="tab:orange")
    right.set(xlabel="step", ylabel="nats per reply token", title="policy entropy")
    right.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
