"""Per-GPU memory of a run, estimated from the model's config.json before any weight is loaded.

Four parts, in bytes per GPU (one line at start-up; a warning above `trainer.gpu_memory_gb`):

- model states of each DeepSpeed engine (the actor, and a model critic if the update has one), from
  DeepSpeed's own estimators on the TRAINABLE parameters (16-bit weights + fp32 master copy, gradients
  and Adam moments: `estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`),
  plus the weights of the FROZEN ones (the base model under LoRA): 2 bytes each in bf16, partitioned over
  the GPUs by ZeRO-3 and none on the GPU when ZeRO-3 offloads parameters. Stage 0 partitions nothing;
  stage 1 is stage 2 with the 16-bit gradients unpartitioned. Both estimators assume 16-bit training.
- the frozen reference (kl_coef > 0 without LoRA): its dtype's bytes per parameter on every GPU; under
  LoRA the reference is the actor with its adapter off (no copy). The vllm engine keeps one more copy
  (and claims its `gpu_memory_utilization`, 0.9 of the GPU by default, up front, whatever it needs).
- activations of the largest pass: an update micro-batch of T = micro_batch_size x max_context_tokens
  tokens, or a scoring micro-batch (no gradient: its logits alone), whichever is larger:

      per token and layer, stored for backward (SwiGLU decoder, sdpa / flash attention, which keep no
      L x L score matrix; after Korthikanti et al. 2022, arXiv:2205.05198, for Qwen's MLP width I):
          a = 6 h + 2 kv_heads head_dim + 4 I   values of `bytes` each
      without checkpointing:   T L a bytes
      with checkpointing:      T (L h + a) bytes   (each layer's input, and one layer recomputed)
      logits:                  T V (bytes + 8)     (the logits, their fp32 copy, one fp32 temporary)

  The vision tower's activations are left out (a Sokoban image is a few dozen tokens of thousands).
- the rollout's KV cache: 2 L kv_heads head_dim bytes x max_context_tokens x concurrent sequences,
  at most GENERATION_BATCH sequences at once (the engines' batch). The hf engine (and `auto`, counted as
  hf) frees it before the update, so the larger of it and the activations counts; vLLM keeps it.

CUDA's context and the allocator's fragmentation (typically 1-3 GB) are not included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
from peft import LoraConfig as PeftLoraConfig
from peft.tuners.tuners_utils import check_target_module_exists
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from vagen.config import LoraConfig, RunConfig
from vagen.models.adapters import adapter_for
from vagen.models.tiny import resolve_model_path

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
GENERATION_BATCH = 64  # HFEngine's max_batch_size and VLLMEngine's max_num_seqs (tested against both)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a checkpoint: parameter counts and the text model's dimensions."""

    params: int  # every parameter, tied ones once
    largest_layer: int  # parameters of the largest module (ZeRO-3 gathers one at a time)
    lora_params: int  # adapter parameters model.lora adds (0 without LoRA)
    lm_head: int  # parameters of an untied LM head (0 when tied to the embedding)
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_shape(path: str | Path, lora: LoraConfig, trust_remote_code: bool = False) -> ModelShape:
    """The shape of the model at `path` (a directory with config.json, or a tiny-model name), counted on
    PyTorch's meta device: no weight is read or allocated."""
    directory = resolve_model_path(path)
    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=trust_remote_code)
    vision = "vision_config" in json.loads((directory / "config.json").read_text())
    auto_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto_class.from_config(config, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    lora_params = 0
    if lora.rank > 0:  # peft's own matching decides which modules get an adapter
        targets = (
            adapter_for(config).lora_targets if lora.target_modules is None else list(lora.target_modules)
        )
        peft_config = PeftLoraConfig(r=lora.rank, target_modules=targets)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and check_target_module_exists(peft_config, name):
                lora_params += lora.rank * (module.in_features + module.out_features)
    head = model.get_output_embeddings()
    tied = head is None or head.weight is model.get_input_embeddings().weight
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),  # parameters() yields a tied weight once
        largest_layer=max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        lora_params=lora_params,
        lm_head=0 if tied else head.weight.numel(),
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        kv_heads=text.num_key_value_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        vocab=text.vocab_size,
    )


@dataclass(frozen=True)
class ZeroSetup:
    """The ZeRO stage and offloads of a DeepSpeed config, and the number of GPUs."""

    stage: int
    gpus: int
    offload_optimizer: bool = False
    offload_param: bool = False

    @classmethod
    def from_deepspeed(cls, ds: dict, gpus: int) -> ZeroSetup:
        zero = ds.get("zero_optimization", {})
        return cls(
            stage=int(zero.get("stage", 0)),
            gpus=gpus,
            offload_optimizer=zero.get("offload_optimizer", {}).get("device", "none") == "cpu",
            offload_param=zero.get("offload_param", {}).get("device", "none") == "cpu",
        )


def model_state_bytes(
    trainable: int, frozen: int, largest_layer: int, zero: ZeroSetup, frozen_bytes: int = 2
) -> int:
    """One DeepSpeed engine's model states on one GPU (module docstring): DeepSpeed's estimate for the
    trainable parameters plus `frozen_bytes` (the weights' dtype) per frozen one (partitioned by ZeRO-3)."""
    n = zero.gpus
    if zero.stage == 3:
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            trainable, largest_layer, num_gpus_per_node=n, cpu_offload=zero.offload_optimizer,
            cpu_offload_params=zero.offload_param,
        )  # fmt: skip
        return gpu + (0 if zero.offload_param else frozen_bytes * frozen // n)
    partitions = 1 if zero.stage == 0 else n
    _, gpu = estimate_zero2_model_states_mem_needs(
        trainable, num_gpus_per_node=partitions, cpu_offload=zero.offload_optimizer and zero.stage > 0
    )
    unpartitioned_grads = 2 * trainable * (n - 1) // n if zero.stage == 1 else 0
    return gpu + unpartitioned_grads + frozen_bytes * frozen


def activation_bytes(tokens: int, shape: ModelShape, dtype_bytes: int, checkpointing: bool) -> int:
    """Activations kept for backward over `tokens` tokens, logits included (module docstring)."""
    per_layer = 6 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate
    stored = shape.layers * shape.hidden + per_layer if checkpointing else shape.layers * per_layer
    return tokens * stored * dtype_bytes + logit_bytes(tokens, shape.vocab, dtype_bytes)


def logit_bytes(tokens: int, vocab: int, dtype_bytes: int) -> int:
    """The logits of `tokens` tokens, their fp32 copy and one fp32 temporary."""
    return tokens * vocab * (dtype_bytes + 8)


def kv_cache_bytes(shape: ModelShape, dtype_bytes: int, context_tokens: int, sequences: int) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes x context tokens x concurrent sequences."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes * context_tokens * sequences


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of each part (module docstring)."""

    actor: int
    critic: int
    reference: int  # the frozen reference's weights
    engine_weights: int  # the vllm engine's copy of the weights
    activations: int
    kv_cache: int
    kv_resident: bool  # vLLM keeps its cache through the update; the hf engine's is freed

    @property
    def total(self) -> int:
        states = self.actor + self.critic + self.reference + self.engine_weights
        if self.kv_resident:
            return states + self.activations + self.kv_cache
        return states + max(self.activations, self.kv_cache)

    def describe(self, zero: ZeroSetup) -> str:
        parts = [f"actor {self.actor / GB:.1f}"]
        if self.critic:
            parts.append(f"critic {self.critic / GB:.1f}")
        if self.reference:
            parts.append(f"reference {self.reference / GB:.1f}")
        if self.engine_weights:
            parts.append(f"vLLM weights {self.engine_weights / GB:.1f}")
        parts += [f"activations {self.activations / GB:.1f}", f"rollout KV cache {self.kv_cache / GB:.1f}"]
        held = "all held at once" if self.kv_resident else "the KV cache freed before the update"
        return (
            f"estimated GB per GPU (ZeRO-{zero.stage}, {zero.gpus} GPU{'s' * (zero.gpus > 1)}): "
            f"{', '.join(parts)}; total {self.total / GB:.1f} ({held}; vagen/memory.py)"
        )


def estimate_memory(cfg: RunConfig, shape: ModelShape, zero: ZeroSetup, model_critic: bool) -> MemoryEstimate:
    """The run's per-GPU memory for a model of `shape` under `zero`; `model_critic`: the update trains a
    value model beside the actor."""
    b = DTYPE_BYTES[cfg.model.dtype]
    lora = shape.lora_params > 0
    trainable, frozen = (shape.lora_params, shape.params) if lora else (shape.params, 0)
    actor = model_state_bytes(trainable, frozen, shape.largest_layer, zero, frozen_bytes=b)
    critic_params = shape.params - shape.lm_head + shape.hidden + 1  # the backbone and a value head
    critic = model_state_bytes(critic_params, 0, shape.largest_layer, zero) if model_critic else 0
    r, t = cfg.rollout, cfg.trainer
    update = activation_bytes(
        t.micro_batch_size * r.max_context_tokens, shape, b, cfg.model.gradient_checkpointing
    )
    scoring = logit_bytes(t.score_micro_batch_size * r.max_context_tokens, shape.vocab, b)
    episodes = r.num_groups * r.group_size // zero.gpus
    sequences = min(GENERATION_BATCH, episodes)
    return MemoryEstimate(
        actor=actor,
        critic=critic,
        reference=b * shape.params if cfg.algo.kl_coef > 0 and not lora else 0,
        engine_weights=b * shape.params if cfg.rollout.engine == "vllm" else 0,
        activations=max(update, scoring),
        kv_cache=kv_cache_bytes(shape, b, r.max_context_tokens, sequences),
        kv_resident=r.engine == "vllm",
    )


def memory_report(cfg: RunConfig, ds: dict, gpus: int, model_critic: bool) -> list[str]:
    """The start-up line, and a warning line when the total exceeds `trainer.gpu_memory_gb` (if set)."""
    zero = ZeroSetup.from_deepspeed(ds, gpus)
    try:
        shape = model_shape(cfg.model.path, cfg.model.lora, cfg.model.trust_remote_code)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:  # advisory: never stops a run
        reason = (str(err).splitlines() or [""])[0]
        return [f"memory estimate unavailable: {type(err).__name__}: {reason}"]
    estimate = estimate_memory(cfg, shape, zero, model_critic)
    lines = [estimate.describe(zero)]
    limit = cfg.trainer.gpu_memory_gb
    if limit and estimate.total > limit * GB:
        lines.append(
            f"WARNING: the estimate {estimate.total / GB:.1f} GB exceeds trainer.gpu_memory_gb={limit:g}; "
            "consider LoRA (model.lora.rank), ZeRO-3 (trainer.deepspeed), gradient checkpointing, smaller "
            "micro-batches or a shorter rollout.max_context_tokens"
        )
    return lines
