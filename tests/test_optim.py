"""vagen.optim: the LR schedules, DeepSpeed's config filled from the run config, and the guarded step."""

import json
import math
from pathlib import Path

import deepspeed
import pytest
import torch

from vagen.batching import derived_sizes
from vagen.config import ConfigError, load_config
from vagen.distributed import init_distributed
from vagen.optim import deepspeed_config, guarded_step, lr_factor, lr_scheduler

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # configs name their DeepSpeed JSON relative to the repository


def factors(schedule: str, warmup: int, total: int, min_lr_ratio: float = 0.0, steps: int = 5) -> list[float]:
    """The learning rate of the first `steps` optimizer steps at peak 1, through torch's scheduler."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = lr_scheduler(optimizer, warmup, schedule, total, min_lr_ratio)
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_schedules_warm_up_linearly_then_hold_or_decay_to_the_floor():
    assert factors("constant", warmup=2, total=4) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0])
    # after 2 warm-up steps, progress p = (k - 2) / (4 - 2) for k = 2, 3, 4
    assert factors("linear", warmup=2, total=4) == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
    assert factors("linear", warmup=2, total=4, min_lr_ratio=0.2) == pytest.approx([0.5, 1.0, 1.0, 0.6, 0.2])
    # cosine: m + (1 - m) (1 + cos(pi p)) / 2 with m = 0.1: p = 0, 1/2, 1
    assert factors("cosine", warmup=2, total=4, min_lr_ratio=0.1) == pytest.approx([0.5, 1.0, 1.0, 0.55, 0.1])
    assert factors("constant", warmup=0, total=4) == pytest.approx([1.0] * 5)
    assert lr_factor(10, 0, "linear", 4) == 0.0  # past the end: the floor, never negative
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_factor(0, 0, "exponential", 4)


def test_deepspeed_auto_values_come_from_the_run_config():
    cfg = load_config(None, ["rollout.num_groups=4", "rollout.group_size=3", "algo.mini_batches=2"])
    cfg.trainer.micro_batch_size = 2
    ds = deepspeed_config(cfg, derived_sizes(cfg, world_size=2))
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 2 * 2 * 2
    assert ds["gradient_clipping"] == cfg.optim.grad_clip
    assert ds["bf16"]["enabled"] is False


def test_deepspeed_file_conflicts_are_refused(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": 99, "zero_optimization": {"stage": 1}}))
    cfg = load_config(None, [f"trainer.deepspeed={bad}"])
    with pytest.raises(ConfigError, match="'train_micro_batch_size_per_gpu' is 99"):
        deepspeed_config(cfg, derived_sizes(cfg, 1))
    bad.write_text(json.dumps({"optimizer": {"type": "AdamW"}}))
    with pytest.raises(ConfigError, match="defines 'optimizer'"):
        deepspeed_config(cfg, derived_sizes(cfg, 1))


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero3_offload"])
def test_deepspeed_files_fill_for_every_stage(name):
    cfg = load_config(None, [f"trainer.deepspeed=configs/deepspeed/{name}.json", "model.dtype=bfloat16"])
    ds = deepspeed_config(cfg, derived_sizes(cfg, 1))
    assert "auto" not in json.dumps(ds)
    assert ds["bf16"]["enabled"] is True
    assert ds["zero_optimization"]["stage"] == (1 if name == "zero1" else 2 if name == "zero2" else 3)


def snapshot(engine) -> torch.Tensor:
    from deepspeed.utils import safe_get_full_fp32_param

    return torch.cat([safe_get_full_fp32_param(p).flatten().clone() for p in engine.module.parameters()])


@pytest.mark.parametrize("stage", [1, 3])
def test_gradient_guard_skips_nonfinite_and_huge_steps(stage):
    init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    config = {
        "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": stage}, "steps_per_print": 10**9,
    }  # fmt: skip
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.1), config=config
    )
    x = torch.randn(2, 4)

    def accumulate_and_step(scale: float) -> tuple[float, bool]:
        engine.backward(engine(x[:1]).sum() * scale)
        engine.step()  # first micro-batch: no boundary
        engine.backward(engine(x[1:]).sum() * scale)
        assert engine.is_gradient_accumulation_boundary()
        return guarded_step(engine, skip_grad_norm=100.0)

    before = snapshot(engine)
    norm, skipped = accumulate_and_step(1e6)  # finite but above the ceiling
    assert skipped and norm > 100.0
    assert torch.equal(snapshot(engine), before)
    norm, skipped = accumulate_and_step(math.nan)
    assert skipped and not math.isfinite(norm)
    assert torch.equal(snapshot(engine), before)
    norm, skipped = accumulate_and_step(1.0)  # a normal step afterwards applies, from clean gradients
    assert not skipped and 0 < norm < 100.0
    after = snapshot(engine)
    assert torch.isfinite(after).all() and not torch.equal(after, before)
    assert engine.skipped_steps == 2
