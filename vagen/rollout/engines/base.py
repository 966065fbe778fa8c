"""The generation-engine interface: token ids + images in, sampled token ids + their log-probs out.

Log-prob convention (both engines): `Generation.logprobs[j]` is the log-probability of the sampled
token under the distribution it was actually drawn from -- logits / temperature, then top-k / top-p
truncation and renormalisation (vLLM's `processed_logprobs`). With top-k and top-p off (the RL
default) this equals `vagen.models.scoring.token_logprobs(..., temperature=T)` of the same model;
temperature 0 means greedy and the log-probs of the raw logits. The trainer recomputes old
log-probs itself, so these serve diagnostics and engine/trainer agreement checks.

Seeds: vLLM seeds each request (`seed + index`), so its samples do not depend on batching; the HF
engine seeds the whole `generate` call, so equal seeds give equal samples for the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from PIL import Image


@dataclass
class Prompt:
    """One generation request. token_ids already contain each image's expanded run of image tokens."""

    token_ids: list[int]
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 -> off
    max_new_tokens: int = 128
    stop_token_ids: list[int] = field(default_factory=list)  # empty -> the tokenizer's eos (<|im_end|>)
    seed: int | None = None
    # Never sampled (their probability is set to 0 before sampling): tokens that only the processor may
    # place in a context (the family adapter's context_only_tokens, e.g. <|image_pad|>): fed back into
    # the next prompt they would pair with no image.
    banned_token_ids: list[int] = field(default_factory=list)


@dataclass
class Generation:
    token_ids: list[int]  # new tokens only, including the stop token when generation stopped on it
    logprobs: list[float]  # one per token_ids entry (see the module docstring)
    finish_reason: str  # "stop" | "length"


class GenerationEngine(Protocol):
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def end_of_turn_id(processor_or_tokenizer) -> int:
    """The default stop token: the tokenizer's eos, which chat checkpoints set to their end-of-turn token
    (<|im_end|> for Qwen's). The rollout passes the chat template's own (ChatCodec.stop_token_ids)."""
    tokenizer = getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; pass SamplingParams.stop_token_ids")
    return tokenizer.eos_token_id


def validate(params: SamplingParams) -> None:
    """Clear errors for sampling parameters no engine accepts."""
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")


def cut_at_stop(token_ids: list[int], logprobs: list[float], stop_ids: set[int]) -> Generation:
    """Keep tokens up to and including the first stop token."""
    for position, token_id in enumerate(token_ids):
        if token_id in stop_ids:
            return Generation(token_ids[: position + 1], logprobs[: position + 1], "stop")
    return Generation(token_ids, logprobs, "length")
