"""The supervised core of the warm start (vagen.pretrain.sft) and of perception pretraining
(vagen.pretrain.perception): masked cross-entropy training, and a cache of its results keyed by its inputs.

Training: AdamW on
    loss = - sum_{b,i} M^loss[b,i] log p(x[b,i] | x[b,<i]) / sum_{b,i} M^loss[b,i]
over mini-batches of rows of similar length, redrawn every epoch (rows of one length are shuffled, so a
batch does not hold one episode's consecutive turns), with the learning rate of vagen.optim.lr_factor.
One process, no DeepSpeed: the tiny model's runs take minutes on a CPU. AdamW's betas, weight decay and
the gradient clip are fixed (ADAMW_BETAS, WEIGHT_DECAY, GRAD_CLIP); the rest is a SupervisedOptim.

Cache: a result is a save_pretrained folder (model + processor + REPORT_FILE) under $VAGEN_CACHE, named by
`inputs_key` over everything that shapes it, written atomically (`save_atomically`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from vagen.config import SupervisedOptim
from vagen.models.scoring import token_logprobs
from vagen.optim import adamw, lr_scheduler
from vagen.rollout.batch import RolloutBatch

REPORT_FILE = "pretrain_report.json"
ADAMW_BETAS = (0.9, 0.98)
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
# Part of every cache key: bumped when the training procedure changes, so that models cached by an older
# one are rebuilt. 2 (2026-12-04): mini-batches from shuffled rows, redrawn every epoch. 3 (2026-12-06):
# mini-batches no longer bucketed by length (it put replies of one length together: MiniGrid's warm start
# learned `Forward`, two tokens longer than `Left`, in 0.17 of its choices from a uniform teacher).
TRAINING_PROCEDURE = 3


def shuffled_batches(num_rows: int, batch_size: int, generator: np.random.Generator) -> list[list[int]]:
    """One epoch of row indices: a random permutation cut into batches of `batch_size`, in random order
    (the last, smaller batch falls at a random step). Every batch is a uniform sample of the rows: batches
    bucketed by length would group rows by what makes them long (an action's name, an episode's turns)
    and the model would chase each group in turn."""
    order = generator.permutation(num_rows).tolist()
    batches = [order[i : i + batch_size] for i in range(0, num_rows, batch_size)]
    return [batches[i] for i in generator.permutation(len(batches))]


def masked_nll(model, batch: RolloutBatch) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-masked tokens (formula in the module docstring)."""
    logp, _ = token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.vision, len(batch), with_entropy=False
    )  # (B, L)
    mask = batch.loss_mask.float()
    return -(logp * mask).sum() / mask.sum().clamp(min=1.0)


def train_supervised(model, data: RolloutBatch, optim: SupervisedOptim, seed: int, log=print) -> list[float]:
    """`optim.steps` AdamW steps on the masked NLL; each step one shuffled mini-batch, every row once per
    epoch and the batches drawn afresh each epoch (order from `seed`). Returns the loss of every step."""
    generator = np.random.default_rng(seed)
    epoch: list[list[int]] = []
    optimizer = adamw(model.parameters(), optim.lr, ADAMW_BETAS, WEIGHT_DECAY)
    scheduler = lr_scheduler(optimizer, optim.warmup_steps, optim.schedule, optim.steps, optim.min_lr_ratio)
    model.train()
    losses = []
    for step in range(optim.steps):
        if not epoch:
            epoch = shuffled_batches(len(data), optim.batch_size, generator)
        batch = data.select(epoch.pop())
        loss = masked_nll(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == optim.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}")
    model.eval()
    return losses


def inputs_key(model_path: Path, configs: dict) -> str:
    """16 hex digits of sha256 over the base model (its path, config and weight files' names and sizes,
    not a report written beside them), `configs` (JSON-able, dataclass values as str) and
    TRAINING_PROCEDURE."""
    model_files = sorted(
        (p.name, p.stat().st_size) for p in model_path.iterdir() if p.is_file() and p.name != REPORT_FILE
    )
    payload = {
        **configs,
        "model": [str(model_path), (model_path / "config.json").read_text(), model_files],
        "training_procedure": TRAINING_PROCEDURE,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_report(folder: Path) -> dict | None:
    """The report of a finished result in `folder`, or None."""
    path = folder / REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def save_atomically(model, processor, report: dict, target: Path) -> None:
    """save_pretrained into a temporary sibling folder, then rename (a half-written model never shows)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2))
        if target.exists():  # an --out folder without a finished result in it
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
