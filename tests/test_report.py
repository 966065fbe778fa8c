"""The end-of-run report: success before/after, the learning-curve PNG, and what to run next."""

import json

import imageio.v3 as iio
import pytest

from vagen.report import LEARNING_CURVE_FILE, end_of_run_report
from vagen.viz.curves import plot_learning_curve


def val(rate: float, low: float, high: float) -> dict[str, float]:
    return {"val/success_rate": rate, "val/success_ci_low": low, "val/success_ci_high": high}


def write_metrics(run_dir, steps: int) -> None:
    lines = [{"step": 0, **val(0.0, 0.0, 0.057)}]
    for step in range(1, steps + 1):
        line = {"step": step, "train/success_rate": step / steps, "actor/entropy": 0.5 - 0.01 * step}
        if step % 5 == 0:
            line |= val(step / steps, step / steps - 0.1, min(1.0, step / steps + 0.1))
        lines.append(line)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_report_writes_the_curve_and_the_next_commands(tmp_path):
    write_metrics(tmp_path, 10)
    (tmp_path / "checkpoints" / "step_000010").mkdir(parents=True)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "index.html").write_text("<html>")

    lines = end_of_run_report(tmp_path, 10, 64, val(0.0, 0.0, 0.057), val(0.5, 0.38, 0.62), "mpo")
    text = "\n".join(lines)

    assert lines[0].startswith("[vagen] algorithm: mpo (where TRICO and the others stand: docs/results.md")

    assert "64 episodes): before 0.000 [0.000, 0.057] -> after 0.500 [0.380, 0.620]" in text
    image = iio.imread(tmp_path / LEARNING_CURVE_FILE)
    assert image.ndim == 3 and image.shape[0] > 200 and image.std() > 0  # a drawn figure, not blank
    assert str(tmp_path / "rollouts" / "index.html") in text
    assert f"--config {tmp_path / 'config.yaml'} trainer.resume=auto trainer.steps=20" in text
    assert f"--checkpoint {tmp_path / 'checkpoints' / 'step_000010'}" in text


def test_report_without_checkpoints_or_rollouts_still_says_where_to_go(tmp_path):
    write_metrics(tmp_path, 3)
    lines = end_of_run_report(tmp_path, 3, 8, val(0.0, 0.0, 0.3), val(0.0, 0.0, 0.3))
    text = "\n".join(lines)
    assert "trainer.resume" not in text and "rollout GIFs" not in text and "algorithm" not in text
    assert "on GPUs" in text and (tmp_path / LEARNING_CURVE_FILE).is_file()


def test_curve_of_a_run_without_success_metrics_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "actor/entropy": 0.3}) + "\n")
    with pytest.raises(ValueError, match="no success metrics"):
        plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
