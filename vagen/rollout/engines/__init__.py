"""Generation engines: `make_engine("hf" | "vllm", model, processor)` (see base.py for the contract)."""

from vagen.rollout.engines.base import Generation, GenerationEngine, Prompt, SamplingParams, make_engine

__all__ = ["Generation", "GenerationEngine", "Prompt", "SamplingParams", "make_engine"]
