"""The GPU check's CPU form (`python -m vagen.gpu_check --cpu`): two TRICO iterations of the 3B recipe's
settings with the tiny VLM in float32 under ZeRO-3, printing every field the GPU form prints."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_cpu_form_prints_every_field_with_sane_values(tmp_path, tiny_vlm_path, one_torch_thread):
    # its own process, as a user runs it: ZeRO-3 leaves process groups behind that later tests must not see
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # set by in-process runs
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(one_torch_thread, DS_ACCELERATOR="cpu", WANDB_MODE="offline")
    command = [sys.executable, "-m", "vagen.gpu_check", "--cpu", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "[vagen] estimated GB per GPU (ZeRO-3, 1 GPU): actor" in out  # the start-up memory line
    fields = dict(re.findall(r"^\[gpu_check\] ([^:]+): (.+)$", out, flags=re.M))
    assert fields["device"].startswith("CPU, measured fp32 matmul, peak")
    assert "ZeRO-3 (zero3.json)" in fields["model"] and "2 TRICO iterations of 2 episodes" in fields["model"]
    number = {
        key: float(value.split()[0].rstrip("%"))
        for key, value in fields.items()
        if key not in ("device", "model")
    }
    assert number["rollout tokens/s"] > 0 and number["update s"] > 0
    assert 0.05 < number["peak memory GB"] < 16  # the process's resident peak
    assert 0 < number["MFU rollout"] < 100 and 0 < number["MFU update"] < 100
    (run_dir,) = tmp_path.glob("run-*")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "learning_curve.png", "metrics.jsonl"]
