"""Checkpoints: RNG round trip, atomic folders, pruning, save + load of DeepSpeed engines."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from vagen import checkpoint
from vagen.batching import derived_sizes
from vagen.config import load_config
from vagen.distributed import init_distributed
from vagen.optim import make_deepspeed_engine

REPO = Path(__file__).resolve().parents[1]


def draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    return one_torch_thread


def test_rng_state_round_trip_through_json_and_safetensors(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    portable, tensors = checkpoint.rng_state()
    expected = draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    import json

    from safetensors.torch import load_file, save_file

    (tmp_path / "rng.json").write_text(json.dumps(portable))
    save_file(tensors, str(tmp_path / "rng.safetensors"))
    checkpoint.set_rng_state(
        json.loads((tmp_path / "rng.json").read_text()), load_file(str(tmp_path / "rng.safetensors"))
    )
    assert draws() == expected


def test_only_complete_checkpoints_are_listed(tmp_path):
    root = checkpoint.checkpoint_root(tmp_path)
    for name in ("step_000002", "step_000010", ".tmp_step_000012"):
        (root / name).mkdir(parents=True)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000002", "step_000010"]
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_000010"
    assert checkpoint.latest_checkpoint(tmp_path / "elsewhere") is None


def test_save_prunes_and_load_restores_weights_optimizer_and_state(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    init_distributed()
    from vagen.models.loading import load_policy

    cfg = load_config(None, ["model.path=tiny-text"])
    sizes = derived_sizes(cfg, 1)
    model, tokenizer = load_policy("tiny-text")
    engine = make_deepspeed_engine(model, 1e-2, cfg, sizes)
    ids = torch.randint(0, 100, (2, 8))

    def train_step():
        for _ in range(sizes.micro_batches_per_step):
            engine.backward(engine.module(input_ids=ids, labels=ids).loss)
            engine.step()

    train_step()
    for step in (1, 2, 3):  # keep_last=2 leaves steps 2 and 3
        checkpoint.save_checkpoint(
            tmp_path, step, engine, None, tokenizer, {"seed_counter": step}, keep_last=2
        )
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    saved = {k: v.clone() for k, v in engine.module.state_dict().items()}
    train_step()  # moves weights and optimizer moments away from the checkpoint
    state = checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path), engine, None)
    assert state == {"step": 3, "seed_counter": 3}
    assert all(torch.equal(v, saved[k]) for k, v in engine.module.state_dict().items())
    actor_dir = tmp_path / "checkpoints" / "step_000003" / "actor"
    assert (actor_dir / "model.safetensors").is_file() and (actor_dir / "tokenizer.json").is_file()
    with pytest.raises(FileNotFoundError, match="world size"):
        (tmp_path / "checkpoints" / "step_000003" / "rng" / "rank_0.json").unlink()
        checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path), engine, None)
