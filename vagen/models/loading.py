"""Load policies, processors and critics from local directories (never from a hub).

One path for every checkpoint: a vision-language directory (config has a `vision_config`) loads with
`AutoModelForImageTextToText` + `AutoProcessor`, anything else with `AutoModelForCausalLM` +
`AutoTokenizer`; what differs between families is in their adapters (vagen.models.adapters). The tiny
models are such directories (vagen.models.tiny).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
)

from vagen.models.adapters import TEXT_ONLY, ModelAdapter, adapter_for
from vagen.models.tiny import resolve_model_path
from vagen.models.vision import VisionInputs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")


def is_vision_language(path: str | Path) -> bool:
    """True for a vision-language checkpoint (its config.json has a vision_config)."""
    return "vision_config" in json.loads((Path(path) / "config.json").read_text())


def check_model_dir(path: Path, need_weights: bool = True, need_tokenizer: bool = True) -> None:
    """One clear error naming every file a model directory lacks."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if need_weights and not any((path / name).is_file() for name in WEIGHT_FILES):
        missing.append(f"weights (one of {', '.join(WEIGHT_FILES)})")
    if need_tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    if missing:
        raise FileNotFoundError(f"model directory {str(path)!r} is missing: {'; '.join(missing)}")


def load_processor(path: str | Path, trust_remote_code: bool = False):
    """AutoProcessor (image processor + tokenizer + chat template) for a VLM, AutoTokenizer otherwise."""
    path = resolve_model_path(path)
    check_model_dir(path, need_weights=False)
    loader = AutoProcessor if is_vision_language(path) else AutoTokenizer
    return loader.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)


def processor_adapter(processor_or_tokenizer) -> ModelAdapter:
    """The family adapter of the model whose processor this is: TextOnly for a bare tokenizer, else read
    from the config.json in the directory the processor was loaded from (load_processor: the model's)."""
    if not hasattr(processor_or_tokenizer, "image_processor"):
        return TEXT_ONLY
    directory = Path(tokenizer_of(processor_or_tokenizer).name_or_path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"cannot tell the processor's model family: no config.json in {str(directory)!r}")
    return adapter_for(AutoConfig.from_pretrained(directory, local_files_only=True))


def tokenizer_of(processor_or_tokenizer):
    """The tokenizer inside a processor (or the tokenizer itself)."""
    return getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)


def _attention_implementation(name: str) -> str:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation {name!r} not in {ATTENTION_IMPLEMENTATIONS}")
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ImportError("attn_implementation='flash_attention_2' needs `pip install flash-attn` (GPU only)")
    return name


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} not in {sorted(DTYPES)}")
    return DTYPES[name]


def apply_lora(model: PreTrainedModel, lora: LoraConfig | Mapping[str, Any]) -> nn.Module:
    """Wrap `model` with peft LoRA adapters; `lora` is a LoraConfig or its keyword arguments
    (target_modules defaults to the family's: the language model's attention and MLP projections)."""
    if not isinstance(lora, LoraConfig):
        targets = adapter_for(model.config).lora_targets
        lora = LoraConfig(**{"target_modules": targets, "task_type": "CAUSAL_LM", **lora})
    return get_peft_model(model, lora)


def load_policy(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
    lora: LoraConfig | Mapping[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> tuple[nn.Module, Any]:
    """(model, processor or tokenizer) from a local directory or a tiny-model name."""
    path = resolve_model_path(path)
    check_model_dir(path)
    auto_class = AutoModelForImageTextToText if is_vision_language(path) else AutoModelForCausalLM
    model = auto_class.from_pretrained(
        path,
        dtype=_dtype(dtype),
        attn_implementation=_attention_implementation(attn_implementation),
        local_files_only=True,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora is not None:
        model = apply_lora(model, lora)
    return model, load_processor(path, trust_remote_code=trust_remote_code)


def checkpoint_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under the names its checkpoint uses, LoRA adapters merged in."""
    if not isinstance(model, PeftModel):
        return model.state_dict()
    model.merge_adapter()
    try:
        return {
            name.removeprefix("base_model.model.").replace(".base_layer", ""): tensor.detach().clone()
            for name, tensor in model.state_dict().items()
            if "lora_" not in name
        }
    finally:
        model.unmerge_adapter()


class ValueModel(nn.Module):
    """Critic: the policy's backbone (without its LM head) plus a scalar head, one value per token.

    values[b, i] = w . h_L[b, i] + c, with h_L the last hidden state; (B, L) float32.
    The head starts at zero, so a fresh critic predicts V = 0 everywhere.
    """

    HEAD_FILE = "value_head.safetensors"

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.adapter = adapter_for(backbone.config)
        self.backbone = self.adapter.backbone(backbone)
        self.config = self.backbone.config
        hidden_size = self.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None = None
    ) -> torch.Tensor:
        """input_ids, attention_mask (B, L) -> values (B, L) float32."""
        hidden = self.backbone(
            **self.adapter.model_inputs(self.config, input_ids, attention_mask, vision)
        ).last_hidden_state
        head_dtype = self.value_head.weight.dtype  # DeepSpeed bf16 casts the head with the backbone
        return self.value_head(hidden.to(head_dtype)).float().squeeze(-1)  # (B, L)

    def save_pretrained(self, out_dir: str | Path) -> None:
        out_dir = Path(out_dir)
        self.backbone.save_pretrained(out_dir)
        save_file(
            {k: v.contiguous() for k, v in self.value_head.state_dict().items()},
            str(out_dir / self.HEAD_FILE),
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "float32",
        attn_implementation: str = "sdpa",
        gradient_checkpointing: bool = False,
    ) -> ValueModel:
        """A saved critic (directory with value_head.safetensors), or a fresh head on a policy checkpoint."""
        path = resolve_model_path(path)
        check_model_dir(path, need_tokenizer=False)
        backbone = AutoModel.from_pretrained(
            path, dtype=_dtype(dtype), attn_implementation=_attention_implementation(attn_implementation),
            local_files_only=True,
        )  # fmt: skip
        if gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        critic = cls(backbone)
        if (path / cls.HEAD_FILE).exists():
            critic.value_head.load_state_dict(load_file(str(path / cls.HEAD_FILE)))
        return critic


def model_inputs(
    config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None
) -> dict[str, torch.Tensor]:
    """Forward keyword arguments for a (B, L) batch and its images, as the model's family takes them."""
    return adapter_for(config).model_inputs(config, input_ids, attention_mask, vision)
