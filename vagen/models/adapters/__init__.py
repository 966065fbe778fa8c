"""One adapter per model family: everything the rest of VAGEN must not know about a family.

The rollout, scoring, engines and trainer ask `adapter_for(config)` (keyed by the HF config's
`model_type`) and never branch on a family. docs/models.md describes the interface and how to add one.
"""

from __future__ import annotations

from vagen.models.adapters.base import ModelAdapter
from vagen.models.adapters.llava import Llava
from vagen.models.adapters.qwen_vl import QwenVL
from vagen.models.adapters.text import TextOnly

# HF config model_type -> the adapter of its family
ADAPTERS: dict[str, ModelAdapter] = {
    "qwen2_vl": QwenVL(),
    "qwen2_5_vl": QwenVL(),
    "qwen3_vl": QwenVL(),
    "llava": Llava(),
}
TEXT_ONLY = TextOnly()


def adapter_for(config) -> ModelAdapter:
    """The adapter of a model's (PretrainedConfig) family: TextOnly without a vision tower.

    Raises ValueError naming the model_type when no adapter serves this vision-language family."""
    if getattr(config, "vision_config", None) is None:
        return TEXT_ONLY
    if config.model_type not in ADAPTERS:
        raise ValueError(
            f"no adapter for vision-language model_type {config.model_type!r} (known: {sorted(ADAPTERS)}); "
            "docs/models.md says how to add one"
        )
    return ADAPTERS[config.model_type]


__all__ = ["ADAPTERS", "TEXT_ONLY", "ModelAdapter", "adapter_for"]
