"""A prepared check of the 3B TRICO recipe on one GPU: `python -m vagen.gpu_check` (scripts/gpu_check.sh).

It builds a randomly initialised model with Qwen2.5-VL-3B-Instruct's public config
(assets/qwen2_5_vl_3b/config.json; the project's tokenizer and processor, whose token ids it takes; no
weight is downloaded), runs `--steps` TRICO iterations of configs/sokoban_qwen2_5_vl_3b_trico.yaml with
the hf engine under DeepSpeed ZeRO-3 in bf16, and prints, for the last iteration:

    rollout tokens/s    sampled tokens / rollout seconds
    update s            the update's seconds (actor and critic)
    peak memory GB      torch.cuda.max_memory_allocated (CPU: the process's peak resident memory)
    MFU                 FLOPs / (seconds x peak FLOP/s), with the usual approximations
                        update: 6 x params x tokens for each trained model (actor, critic);
                        rollout: 2 x params x sampled tokens (prompts' prefill left out)

The peak is the GPU's dense bf16 datasheet figure, looked up by name; another GPU, or the CPU, gets a
measured matmul peak. One GPU cannot hold the recipe as published (a full actor and a full critic:
~170 GB by vagen/memory.py), so the actor gets LoRA (rank 64) as in the 24 GB recipes, and ZeRO-3 also
offloads to the CPU when the estimate exceeds the GPU's memory; the memory line says what it chose.
No checkpoint is written: one of a 3B actor and critic with Adam states would fill the machine's disk.

`--cpu`: the same fields for the tiny VLM in float32 on the CPU (ZeRO-1), a few episodes (a test).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from vagen import trainer
from vagen.batching import derived_sizes
from vagen.config import RunConfig, load_config
from vagen.memory import GB, ZeroSetup, estimate_memory, model_shape
from vagen.metrics import read_metrics
from vagen.models.tiny import ASSETS, TOKENIZER_FILES, cache_root
from vagen.optim import deepspeed_config
from vagen.updates import POLICY_UPDATES

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "sokoban_qwen2_5_vl_3b_trico.yaml"
QWEN_3B_CONFIG = REPO / "assets" / "qwen2_5_vl_3b" / "config.json"
# dense bf16 tensor-core peak (NVIDIA datasheets), the first name that appears in the device's name
PEAK_BF16_FLOPS = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM / HBM3
    "H200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
}
# the project's tokenizer's ids replace Qwen's (assets/tiny/vlm_config.json)
TOKEN_ID_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def build_random_3b(out_dir: Path, device: str) -> Path:
    """A save_pretrained directory: Qwen2.5-VL-3B's architecture, random bf16 weights, our tokenizer."""
    if (out_dir / "config.json").exists():
        return out_dir
    values = json.loads(QWEN_3B_CONFIG.read_text())
    tiny = json.loads((ASSETS / "vlm_config.json").read_text())
    values |= {key: tiny[key] for key in TOKEN_ID_KEYS}
    values |= {key: tiny["text_config"][key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = values["eos_token_id"]
    model.generation_config.pad_token_id = values["pad_token_id"]
    staging = out_dir.with_name(out_dir.name + ".partial")
    model.save_pretrained(staging)
    for file in (*TOKENIZER_FILES, "processor_config.json"):
        shutil.copyfile(ASSETS / file, staging / file)
    staging.rename(out_dir)
    return out_dir


def measured_peak_flops(device: str, dtype: torch.dtype) -> float:
    """FLOP/s of the best of a few large matmuls on `device` (the peak when no datasheet figure is known)."""
    n = 4096 if device == "cuda" else 512
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_flops(device: str) -> tuple[float, str]:
    """(peak FLOP/s, where the figure comes from)."""
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        for key, flops in PEAK_BF16_FLOPS.items():
            if key in name:
                return flops, f"{name}, datasheet dense bf16"
        return measured_peak_flops("cuda", torch.bfloat16), f"{name}, measured bf16 matmul"
    return measured_peak_flops("cpu", torch.float32), "CPU, measured fp32 matmul"


def check_config(cpu: bool, groups: int, steps: int, run_dir: Path, model_path: str) -> RunConfig:
    """The TRICO recipe, shortened to `steps` iterations of `groups` episodes, on one device."""
    overrides = [
        f"model.path={model_path}",
        "rollout.engine=hf",
        f"rollout.num_groups={groups}",
        f"trainer.steps={steps}",
        "trainer.val_groups=1",
        "trainer.val_every=0",
        "trainer.viz_every=0",
        "trainer.score_micro_batch_size=1",
        f"trainer.run_dir={run_dir}",
        "model.lora.rank=64",
        "model.lora.alpha=32",
    ]
    if cpu:  # the tiny VLM: float32, short replies
        overrides += ["model.dtype=float32"]
        overrides += ["rollout.max_new_tokens=8", "model.lora.rank=8", "model.gradient_checkpointing=false"]
    return load_config(RECIPE, overrides)


def fitting_deepspeed(cfg: RunConfig, gpu_bytes: float) -> RunConfig:
    """ZeRO-3 as the recipe has it, or ZeRO-3 with CPU offload when the estimate exceeds 90% of the GPU (the
    estimate leaves out CUDA's context and the allocator's fragmentation)."""
    ds = deepspeed_config(cfg, derived_sizes(cfg, 1))
    critic = POLICY_UPDATES[cfg.algo.policy_loss].critic(cfg) == "model"
    estimate = estimate_memory(
        cfg, model_shape(cfg.model.path, cfg.model.lora), ZeroSetup.from_deepspeed(ds, 1), critic
    )
    if estimate.total > 0.9 * gpu_bytes:
        cfg.trainer.deepspeed = str(REPO / "configs" / "deepspeed" / "zero3_offload.json")
    return cfg


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="the tiny VLM in float32 on the CPU")
    parser.add_argument("--steps", type=int, default=2, help="TRICO iterations")
    parser.add_argument("--groups", type=int, default=None, help="episodes per iteration (16; --cpu 2)")
    parser.add_argument("--out", default=None, help="working folder (default $VAGEN_CACHE/gpu_check)")
    args = parser.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device (use --cpu for the CPU form)")
    out = Path(args.out or cache_root() / "gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    model_path = "tiny-vlm" if args.cpu else str(build_random_3b(out / "qwen2_5_vl_3b-random", device))
    run_dir = out / f"run-{int(time.time())}"
    groups = args.groups or (2 if args.cpu else 16)
    cfg = check_config(args.cpu, groups, args.steps, run_dir, model_path)
    if device == "cuda":
        cfg = fitting_deepspeed(cfg, torch.cuda.get_device_properties(0).total_memory)
        torch.cuda.reset_peak_memory_stats()
    save, trainer.save = trainer.save, lambda *args, **kwargs: None  # no checkpoint (module docstring)
    try:
        trainer.train(cfg)
    finally:
        trainer.save = save
    last = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1][-1]
    shape = model_shape(cfg.model.path, cfg.model.lora)
    trained = 2 if POLICY_UPDATES[cfg.algo.policy_loss].critic(cfg) == "model" else 1  # actor (+ critic)
    episodes = cfg.rollout.num_groups * cfg.rollout.group_size
    sampled = last["train/response_tokens"] * last["train/turns_mean"] * episodes
    update_tokens = last["time/update_tokens_per_s"] * last["time/update_s"]
    if device == "cuda":
        peak_memory = torch.cuda.max_memory_allocated() / GB
    else:  # ru_maxrss is in KiB on Linux
        peak_memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
    peak, source = peak_flops(device)
    rollout_mfu = 2 * shape.params * sampled / last["time/rollout_s"] / peak
    update_mfu = 6 * trained * shape.params * update_tokens / last["time/update_s"] / peak
    zero = json.loads(Path(cfg.trainer.deepspeed).read_text())["zero_optimization"]["stage"]
    print(f"[gpu_check] device: {source}, peak {peak / 1e12:.3f} TFLOP/s")
    print(
        f"[gpu_check] model: {shape.params / 1e9:.3f}B params, {cfg.model.dtype}, ZeRO-{zero} "
        f"({Path(cfg.trainer.deepspeed).name}), actor LoRA rank {cfg.model.lora.rank}, engine hf, "
        f"{args.steps} TRICO iterations of {episodes} episodes"
    )
    print(f"[gpu_check] rollout tokens/s: {sampled / last['time/rollout_s']:.1f} ({sampled:.0f} tokens)")
    print(f"[gpu_check] update s: {last['time/update_s']:.2f} ({update_tokens:.0f} tokens)")
    print(f"[gpu_check] peak memory GB: {peak_memory:.2f}")
    print(f"[gpu_check] MFU rollout: {100 * rollout_mfu:.3f}% (2 x params x sampled tokens)")
    print(f"[gpu_check] MFU update: {100 * update_mfu:.3f}% (6 x params x tokens x {trained} models)")


if __name__ == "__main__":
    main()
