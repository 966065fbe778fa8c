"""vagen.memory: DeepSpeed's model-state estimators with frozen parameters, the activation and KV-cache
formulas on hand-computed numbers, the shapes of the shipped config.json files, and the start-up lines."""

import inspect
from pathlib import Path

import pytest

from vagen.config import ConfigError, LoraConfig, load_config
from vagen.memory import (
    GENERATION_BATCH,
    ModelShape,
    ZeroSetup,
    activation_bytes,
    estimate_memory,
    kv_cache_bytes,
    memory_report,
    model_shape,
    model_state_bytes,
)
from vagen.rollout.engines.hf import HFEngine
from vagen.rollout.engines.vllm import VLLMEngine

REPO = Path(__file__).resolve().parents[1]
SMALL = ModelShape(
    params=1000, largest_layer=100, lora_params=0, lm_head=0,
    layers=3, hidden=4, intermediate=8, kv_heads=1, head_dim=2, vocab=10,
)  # fmt: skip


@pytest.mark.parametrize(
    ("zero", "frozen", "expected"),
    [
        (ZeroSetup(stage=0, gpus=4), 0, 2 * 1000 + 18 * 1000),  # nothing partitioned
        (ZeroSetup(stage=2, gpus=1), 0, 20_000),  # 2 bytes of 16-bit weights + 18 of grads, master, Adam
        (ZeroSetup(stage=2, gpus=4), 0, 2000 + 18_000 // 4),
        (ZeroSetup(stage=1, gpus=4), 0, 2000 + 18_000 // 4 + 2 * 1000 * 3 // 4),  # full 16-bit grads
        (ZeroSetup(stage=2, gpus=1), 4000, 20_000 + 2 * 4000),  # frozen: 16-bit weights only
        (ZeroSetup(stage=3, gpus=4), 4000, 4 * 100 + 18_000 // 4 + 2 * 4000 // 4),  # all partitioned
        (ZeroSetup(stage=3, gpus=4, offload_optimizer=True, offload_param=True), 4000, 4 * 100),
    ],
)
def test_model_states_are_deepspeeds_estimate_plus_the_frozen_weights(zero, frozen, expected):
    assert model_state_bytes(1000, frozen, 100, zero) == expected


def test_frozen_weights_take_their_dtypes_bytes():
    assert model_state_bytes(1000, 4000, 100, ZeroSetup(stage=2, gpus=1), frozen_bytes=4) == 20_000 + 16_000


def test_an_unreadable_model_gives_a_line_not_an_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    cfg = load_config(None, [f"model.path={tmp_path}"])
    (line,) = memory_report(cfg, {"zero_optimization": {"stage": 1}}, 1, model_critic=False)
    assert line.startswith("memory estimate unavailable: ValueError")


def test_zero_setup_reads_stage_and_offloads_from_the_deepspeed_files():
    import json

    offload = json.loads((REPO / "configs/deepspeed/zero3_offload.json").read_text())
    assert ZeroSetup.from_deepspeed(offload, 2) == ZeroSetup(3, 2, True, True)
    assert ZeroSetup.from_deepspeed({"zero_optimization": {"stage": 2}}, 1) == ZeroSetup(2, 1)


def test_activation_and_kv_cache_formulas_on_hand_computed_numbers():
    # per token and layer: 6 h + 2 kv head_dim + 4 I = 24 + 4 + 32 = 60 values; logits 5 x 10 x (2 + 8)
    assert activation_bytes(5, SMALL, 2, checkpointing=False) == 5 * 3 * 60 * 2 + 500
    assert activation_bytes(5, SMALL, 2, checkpointing=True) == 5 * (3 * 4 + 60) * 2 + 500
    assert kv_cache_bytes(SMALL, 2, context_tokens=100, sequences=7) == 2 * 3 * 1 * 2 * 2 * 100 * 7


def test_generation_batch_is_the_engines_default():
    assert inspect.signature(HFEngine).parameters["max_batch_size"].default == GENERATION_BATCH
    assert inspect.signature(VLLMEngine).parameters["max_num_seqs"].default == GENERATION_BATCH


def test_shipped_configs_give_the_published_parameter_counts():
    """assets/*/config.json hold the public config values: Qwen2.5-VL-3B-Instruct's model card says 3.75B
    parameters, Qwen3-VL-2B-Instruct's 2B (2.13B)."""
    lora = LoraConfig(rank=64, alpha=32)
    qwen25 = model_shape(REPO / "assets/qwen2_5_vl_3b", lora)
    assert qwen25.params == 3_754_622_976 and qwen25.lm_head == 0  # tied embedding, counted once
    assert qwen25.largest_layer == 151_936 * 2048  # the embedding
    # LoRA on q, k, v, o, gate, up, down of 36 layers: r (in + out) each, the vision tower untouched
    per_layer = 2 * (2048 + 2048) + 2 * (2048 + 256) + 3 * (2048 + 11008)
    assert qwen25.lora_params == 36 * 64 * per_layer == 119_734_272
    assert (qwen25.layers, qwen25.hidden, qwen25.kv_heads, qwen25.head_dim) == (36, 2048, 2, 128)
    qwen3 = model_shape(REPO / "assets/qwen3_vl_2b", LoraConfig())
    assert qwen3.params == 2_127_532_032 and qwen3.lora_params == 0
    assert (qwen3.layers, qwen3.kv_heads, qwen3.head_dim, qwen3.intermediate) == (28, 8, 128, 6144)


def test_estimate_of_the_3b_lora_recipe_by_hand():
    cfg = load_config(REPO / "configs/sokoban_qwen2_5_vl_3b_lora_24gb.yaml", ["trainer.deepspeed=" + str(
        REPO / "configs/deepspeed/zero2.json")])  # fmt: skip
    shape = model_shape(REPO / "assets/qwen2_5_vl_3b", cfg.model.lora)
    estimate = estimate_memory(cfg, shape, ZeroSetup(stage=2, gpus=1), model_critic=False)
    assert estimate.actor == 20 * 119_734_272 + 2 * 3_754_622_976  # LoRA states + frozen bf16 weights
    assert estimate.critic == estimate.reference == estimate.engine_weights == 0  # reference: adapter off
    checkpointed = 2400 * (36 * 2048 + 56_832) * 2  # a = 6 h + 2 kv hd + 4 I = 56,832
    assert estimate.activations == checkpointed + 2400 * 151_936 * 10
    assert estimate.kv_cache == 2 * 36 * 2 * 128 * 2 * 2400 * 64  # 64 of the 128 episodes at once
    assert estimate.total == estimate.actor + estimate.kv_cache == 15_566_241_792  # hf: KV freed first


def test_gpu_memory_gb_is_checked_and_warns_only_above_the_estimate(tiny_vlm_path):
    assert load_config(None).trainer.gpu_memory_gb == 0
    with pytest.raises(ConfigError, match="'trainer.gpu_memory_gb': must be >= 0"):
        load_config(None, ["trainer.gpu_memory_gb=-1"])
    ds = {"zero_optimization": {"stage": 1}}
    quiet = memory_report(load_config(None, ["model.path=tiny-vlm"]), ds, 1, model_critic=True)
    assert len(quiet) == 1 and quiet[0].startswith("estimated GB per GPU (ZeRO-1, 1 GPU): actor 0.0, critic")
    low = load_config(None, ["model.path=tiny-vlm", "trainer.gpu_memory_gb=0.001"])
    lines = memory_report(low, ds, 1, model_critic=True)
    assert len(lines) == 2 and lines[1].startswith("WARNING: the estimate")
    assert "exceeds trainer.gpu_memory_gb=0.001" in lines[1]
