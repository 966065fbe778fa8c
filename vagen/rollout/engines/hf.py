"""Batched transformers `generate` with KV cache, on the trainer's own model object."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from vagen.models.adapters import adapter_for
from vagen.models.loading import tokenizer_of
from vagen.models.vision import encode_images
from vagen.rollout.engines.base import (
    Generation,
    Prompt,
    SamplingParams,
    cut_at_stop,
    end_of_turn_id,
    validate,
)


class SampledTokenLogprobs(LogitsProcessor):
    """Last in the processor list: records log softmax(processed scores)[sampled token] per step.

    At step s it sees the token sampled at step s-1 as the last column of input_ids, so it keeps
    only one (B, V) row of log-probs alive; `finish` reads the final step's token.
    """

    def __init__(self):
        self.previous: torch.Tensor | None = None  # (B, V) log-probs of the last step
        self.steps: list[torch.Tensor] = []  # each (B,)

    def _record(self, sampled: torch.Tensor) -> None:
        self.steps.append(self.previous.gather(1, sampled[:, None]).squeeze(1))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self._record(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """new_tokens (B, S) -> log-probs (B, S)."""
        self._record(new_tokens[:, -1])
        return torch.stack(self.steps, dim=1)


class HFEngine:
    """GenerationEngine over `model.generate`: prompts left-padded into batches of `max_batch_size`."""

    def __init__(self, model: torch.nn.Module, processor: Any, max_batch_size: int = 64):
        self.model = model
        self.adapter = adapter_for(model.config)
        self.processor = processor
        self.tokenizer = tokenizer_of(processor)
        self.end_of_turn_id = end_of_turn_id(processor)
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_of_turn_id
        )
        self.max_batch_size = max_batch_size

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        validate(params)
        generations = []
        for start in range(0, len(prompts), self.max_batch_size):
            generations += self._generate_batch(prompts[start : start + self.max_batch_size], params)
        return generations

    @torch.no_grad()
    def _generate_batch(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        length = max(len(p.token_ids) for p in prompts)
        input_ids = torch.full((len(prompts), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding: generation continues at the right edge
            input_ids[row, length - len(prompt.token_ids) :] = torch.tensor(prompt.token_ids)
            attention_mask[row, length - len(prompt.token_ids) :] = 1
        vision = encode_images(self.processor, self.adapter, [image for p in prompts for image in p.images])
        inputs = self.adapter.model_inputs(self.model.config, input_ids, attention_mask, vision)
        inputs = {k: v.to(device) for k, v in inputs.items()}

        stop_ids = params.stop_token_ids or [self.end_of_turn_id]
        recorder = SampledTokenLogprobs()
        do_sample = params.temperature > 0
        warpers = []
        if do_sample:  # the same order as vLLM: temperature, top-k, top-p
            warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1:
                warpers.append(TopPLogitsWarper(params.top_p))
        was_training = self.model.training
        self.model.eval()  # gradient checkpointing in train mode would switch the KV cache off
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                if params.seed is not None:
                    torch.manual_seed(params.seed)
                sequences = self.model.generate(
                    **inputs,
                    do_sample=do_sample,
                    # Explicit neutral values override a checkpoint's generation_config.json (Qwen
                    # ships top_k=1, repetition_penalty=1.05); the warpers above do the sampling
                    # transforms, the recorder sees their output.
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    repetition_penalty=1.0,
                    suppress_tokens=list(params.banned_token_ids) or None,
                    max_new_tokens=params.max_new_tokens,
                    eos_token_id=stop_ids,
                    pad_token_id=self.pad_id,
                    logits_processor=LogitsProcessorList([*warpers, recorder]),
                    use_cache=True,
                )
        finally:
            self.model.train(was_training)
        new_tokens = sequences[:, length:].cpu()  # (B, S)
        logprobs = recorder.finish(new_tokens).cpu()
        return [
            cut_at_stop(new_tokens[row].tolist(), logprobs[row].tolist(), set(stop_ids))
            for row in range(len(prompts))
        ]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s weights in, unless the engine already generates with that very object."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
