"""Optimizers: AdamW, the learning-rate schedules, DeepSpeed's config and engines, and the guarded step.

The schedules are one function, `lr_factor`, shared by the RL models (DeepSpeed engines and the state
critic's AdamW are stepped by the trainer) and the supervised runs (vagen.pretrain):

    f(k) = (k + 1) / W                                    for optimizer step k < W (linear warm-up)
    f(k) = d(p),  p = (k - W) / max(T - W, 1)             after it, T = the run's optimizer steps
    d(p) = 1 (constant) | m + (1 - m) (1 - p) (linear) | m + (1 - m) (1 + cos(pi p)) / 2 (cosine)

with m = min_lr_ratio: the learning rate of step k is lr * f(k).
"""

import json
import math
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.utils import safe_get_full_grad, safe_set_full_grad

from vagen.batching import DerivedSizes
from vagen.config import ConfigError, RunConfig


def lr_factor(
    step: int, warmup_steps: int, schedule: str, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """f(step) of the module docstring."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    if schedule == "linear":
        return min_lr_ratio + (1 - min_lr_ratio) * max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "constant":
        return 1.0
    raise ValueError(f"unknown schedule {schedule!r}; choose constant, linear or cosine")


def lr_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, schedule: str, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """torch's LambdaLR over `lr_factor`: step it after every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: lr_factor(k, warmup_steps, schedule, total_steps, min_lr_ratio)
    )


def adamw(params, lr: float, betas: tuple[float, float], weight_decay: float = 0.0) -> torch.optim.AdamW:
    """torch's AdamW (epsilon 1e-8) over the trainable `params`."""
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=1e-8, weight_decay=weight_decay)


def deepspeed_config(cfg: RunConfig, sizes: DerivedSizes) -> dict[str, Any]:
    """The JSON file of `trainer.deepspeed` with its "auto" entries filled from the run config.

    The optimizer and LR schedule belong to the run config (a torch AdamW, no JIT-compiled Adam),
    so a DeepSpeed file that defines them is refused, as is a value that contradicts the run config.
    """
    path = cfg.trainer.deepspeed
    try:
        ds = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"bad value for config key 'trainer.deepspeed': cannot read {path}: {err}"
        ) from None
    if not isinstance(ds, dict):
        raise ConfigError(f"bad value for config key 'trainer.deepspeed': {path} does not hold a JSON object")
    for owned in ("optimizer", "scheduler"):
        if owned in ds:
            raise ConfigError(f"{path} defines '{owned}'; set it in the run config (optim.*)")
    filled = {
        "train_micro_batch_size_per_gpu": cfg.trainer.micro_batch_size,
        "gradient_accumulation_steps": sizes.micro_batches_per_step,
        "train_batch_size": cfg.trainer.micro_batch_size * sizes.micro_batches_per_step * sizes.world_size,
        "gradient_clipping": cfg.optim.grad_clip,
    }
    for key, value in filled.items():
        if ds.get(key, "auto") not in ("auto", value):
            raise ConfigError(f"{path}: '{key}' is {ds[key]} but the run config needs {value}")
        ds[key] = value
    ds.setdefault("bf16", {})["enabled"] = cfg.model.dtype == "bfloat16"
    return ds


def make_deepspeed_engine(model: torch.nn.Module, lr: float, cfg: RunConfig, sizes: DerivedSizes):
    """A DeepSpeed engine around `model` with AdamW at peak `lr` and the run's LR schedule."""
    o = cfg.optim
    optimizer = adamw([p for p in model.parameters() if p.requires_grad], lr, o.betas, o.weight_decay)
    total = cfg.trainer.steps * sizes.optimizer_steps_per_iteration
    scheduler = lr_scheduler(optimizer, o.warmup_steps, o.schedule, total, o.min_lr_ratio)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg, sizes)
    )
    return engine


def guarded_step(engine, skip_grad_norm: float) -> tuple[float, bool]:
    """engine.step() at a gradient-accumulation boundary unless the gradient norm is bad.

    The global norm is computed from the reduced gradients before stepping. If it is not finite or
    exceeds `skip_grad_norm`, one gradient entry is set to NaN so that DeepSpeed's own overflow path
    skips the optimizer (parameters, moments and LR schedule untouched) and clears the gradients.
    Returns (norm, skipped). Collective: all ranks call it on the same micro-step.
    """
    params = [p for p in engine.module.parameters() if p.requires_grad]
    squares = 0.0
    for p in params:  # ZeRO-3: safe_get_full_grad gathers each partition (collective)
        grad = safe_get_full_grad(p)
        if grad is not None:
            squares += float(grad.double().pow(2).sum())
    norm = math.sqrt(squares) if math.isfinite(squares) else math.inf
    skip = not norm <= skip_grad_norm
    if skip:
        grad = safe_get_full_grad(params[0])
        safe_set_full_grad(params[0], torch.full_like(grad, math.nan))
    engine.step()
    return norm, skip


def backward_and_step(engine, loss: torch.Tensor, skip_grad_norm: float) -> tuple[float | None, bool]:
    """engine.backward, then engine.step (guarded at accumulation boundaries).

    Returns (gradient norm, skipped) at a boundary, (None, False) on the micro-steps before it."""
    engine.backward(loss)
    if not engine.is_gradient_accumulation_boundary():
        engine.step()  # DeepSpeed counts micro-steps; no optimizer step happens here
        return None, False
    return guarded_step(engine, skip_grad_norm)
