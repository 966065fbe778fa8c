"""Generation engines: `make_engine("hf" | "vllm", model, processor)` (see base.py for the contract)."""

from typing import Any

import torch

from vagen.config import RolloutConfig
from vagen.rollout.engines.base import Generation, GenerationEngine, Prompt, SamplingParams


def _hf(
    model: torch.nn.Module, processor: Any, rollout: RolloutConfig | None, **options: Any
) -> GenerationEngine:
    from vagen.rollout.engines.hf import HFEngine

    return HFEngine(model, processor, **options)


def _vllm(
    model: torch.nn.Module, processor: Any, rollout: RolloutConfig | None, **options: Any
) -> GenerationEngine:
    from vagen.rollout.engines.vllm import VLLMEngine  # imports vLLM: only when asked for

    if rollout is not None:  # vLLM sizes its context and its per-prompt image limit up front
        budgets = {
            "max_model_len": rollout.max_context_tokens,
            "max_images_per_prompt": rollout.max_images_per_prompt,
        }
        options = budgets | options
    return VLLMEngine(model, processor, **options)


ENGINES = {"hf": _hf, "vllm": _vllm}


def make_engine(
    name: str, model: torch.nn.Module, processor: Any, rollout: RolloutConfig | None = None, **options: Any
) -> GenerationEngine:
    """The engine `name`: "hf" (batched transformers generate on `model` itself) or "vllm" (in-process
    vLLM loaded from the directory `model` came from; `sync_weights` updates it). `rollout`: the budgets
    an engine sizes itself for; `options` go to the engine's constructor."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}")
    return ENGINES[name](model, processor, rollout, **options)


__all__ = ["ENGINES", "Generation", "GenerationEngine", "Prompt", "SamplingParams", "make_engine"]
