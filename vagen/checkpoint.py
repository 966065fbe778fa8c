"""Atomic checkpoints with everything an exact resume needs.

Layout of `<run_dir>/checkpoints/step_000012/`:
    actor/            save_pretrained format (config, safetensors, processor); a peft adapter under LoRA
    critic/           ValueModel.save_pretrained (backbone + value_head.safetensors), if trained
    deepspeed/actor/  DeepSpeed engine state (ZeRO optimizer partitions, LR schedule), ditto critic/
    state_critic/     algo.critic=state: the MLP's weights and AdamW state (safetensors + JSON)
    rng/rank_<r>.json python + numpy RNG states; rng/rank_<r>.safetensors torch RNG state(s)
    trainer_state.json step, seed counters, skip and rollback counts (anything else the loop needs)

A checkpoint is written into `.tmp_step_000012/` and renamed when every rank has finished, so a
folder named `step_*` is always complete; a run killed mid-save leaves only a `.tmp_*` folder that
the next save removes. All ranks must see the same `run_dir` (a shared filesystem across nodes).
Weights are safetensors; our own files are JSON or safetensors, never pickle. DeepSpeed reads its
own engine files (`engine.load_checkpoint`).
"""

import contextlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

CHECKPOINT_PREFIX = "step_"
DEEPSPEED_TAG = "state"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoint_root(run_dir) / f"{CHECKPOINT_PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders are never listed)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON-able python/numpy states, torch states as tensors)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    portable = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
    }
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state()
    return portable, tensors


def set_rng_state(portable: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, internal, gauss = portable["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = portable["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])


def gathered_weights(engine):
    """Context in which the engine's module holds its complete weights on every rank.

    Collective under ZeRO-3 (all ranks must enter it): the parameter partitions are gathered.
    """
    if engine.zero_optimization_stage() == 3:
        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    return contextlib.nullcontext()


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    actor_engine,
    critic_engine,
    processor,
    trainer_state: dict[str, Any],
    keep_last: int,
    state_critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
) -> Path:
    """Write checkpoint `step` atomically on all ranks and prune all but the newest `keep_last`.

    Collective: every rank calls it.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(".tmp_" + final.name)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    _barrier()

    engines = {"actor": actor_engine} | ({"critic": critic_engine} if critic_engine is not None else {})
    for name, engine in engines.items():
        with gathered_weights(engine):
            if rank == 0:
                # save_pretrained: a peft model writes its adapter, a plain model its weights (safetensors)
                engine.module.save_pretrained(tmp / name)
        engine.save_checkpoint(str(tmp / "deepspeed" / name), tag=DEEPSPEED_TAG, save_latest=False)
    if rank == 0:
        processor.save_pretrained(tmp / "actor")
        if state_critic is not None:  # identical on every rank (reduced gradients): rank 0 writes it
            save_module_state(tmp / "state_critic", *state_critic)
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))

    portable, tensors = rng_state()
    (tmp / "rng" / f"rank_{rank}.json").write_text(json.dumps(portable))
    save_file(tensors, str(tmp / "rng" / f"rank_{rank}.safetensors"))
    _barrier()

    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)  # a rollback may rewrite a step
        tmp.rename(final)  # the commit point
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old)
    _barrier()
    return final


def save_module_state(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A plain torch module and its optimizer: weights and per-parameter optimizer tensors as
    safetensors, the optimizer's param groups as JSON."""
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / "model.safetensors"))
    optim_state = optimizer.state_dict()
    tensors = {f"{i}.{k}": v for i, st in optim_state["state"].items() for k, v in st.items()}
    save_file(tensors, str(folder / "optimizer.safetensors"))
    (folder / "param_groups.json").write_text(json.dumps(optim_state["param_groups"]))


def load_module_state(folder: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Inverse of `save_module_state`."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} missing: the checkpoint was written without this module")
    module.load_state_dict(load_file(str(folder / "model.safetensors")))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(str(folder / "optimizer.safetensors")).items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = json.loads((folder / "param_groups.json").read_text())
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def load_checkpoint(
    path: str | Path,
    actor_engine,
    critic_engine,
    state_critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
) -> dict[str, Any]:
    """Restore engines (weights, optimizer, LR schedule) and this rank's RNG; return trainer_state.

    Collective: every rank calls it.
    """
    path = Path(path)
    rank = dist.get_rank() if dist.is_initialized() else 0
    state = json.loads((path / "trainer_state.json").read_text())
    engines = {"actor": actor_engine} | ({"critic": critic_engine} if critic_engine is not None else {})
    for name, engine in engines.items():
        loaded, _ = engine.load_checkpoint(str(path / "deepspeed" / name), tag=DEEPSPEED_TAG)
        if loaded is None:
            raise FileNotFoundError(f"no DeepSpeed state for the {name} in {path}")
    rng_file = path / "rng" / f"rank_{rank}.json"
    if not rng_file.is_file():
        raise FileNotFoundError(
            f"{rng_file} missing: resume with the world size the checkpoint was written with"
        )
    set_rng_state(json.loads(rng_file.read_text()), load_file(str(path / "rng" / f"rank_{rank}.safetensors")))
    if state_critic is not None:
        load_module_state(path / "state_critic", *state_critic)
    return state
