"""The interface every model family implements (docs/models.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import nn

from vagen.models.vision import VisionInputs

# The language model's attention and MLP projections, never the vision tower's: LoRA's usual targets.
LANGUAGE_PROJECTIONS = r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def language_backbone(model: nn.Module) -> nn.Module:
    """The transformer of a *ForCausalLM / *ForConditionalGeneration (its `.model`), or `model` itself when
    it was loaded without an LM head (AutoModel)."""
    return model.model if hasattr(model, "lm_head") else model


def collapse_runs(token_ids: list[int], token_id: int) -> list[int]:
    """Each run of `token_id` shortened to one token."""
    return [t for i, t in enumerate(token_ids) if t != token_id or i == 0 or token_ids[i - 1] != token_id]


class VisionAdapter:
    """What the vision-language families share: the image token is `config.image_token_id`, vLLM's input
    processor expands each image token it is given (so its prompts carry one per image), and the critic
    reads the language backbone. Subclasses give the rest of ModelAdapter."""

    engine_weight_prefixes: dict[str, str] = {}

    def image_token_id(self, config) -> int:
        return config.image_token_id

    def engine_prompt(self, config, token_ids: list[int]) -> list[int]:
        return collapse_runs(token_ids, config.image_token_id)

    def backbone(self, model: nn.Module) -> nn.Module:
        return language_backbone(model)


class ModelAdapter(Protocol):
    """What VAGEN needs to know about one family of models; `config` is the model's PretrainedConfig."""

    # Tokens that stand for images in a context: never sampled, since a reply holding one would pair
    # with no image when fed back (or scored).
    context_only_tokens: tuple[str, ...]
    # peft target_modules (a regex over module names) when model.lora.target_modules is not given.
    lora_targets: str
    # Renames (old prefix -> new) of the policy's weight names that vLLM's model loads; non-empty: vLLM
    # cannot read the saved checkpoint, so its engine starts from dummy weights and loads these.
    engine_weight_prefixes: dict[str, str]

    def merged_token_pixels(self, config) -> int | None:
        """Side in pixels of the image square one visual token covers (None: a text-only model).
        Envs render their cells at this size, so one cell is one token."""

    def image_token_id(self, config) -> int | None:
        """Id of the token that marks one visual token's place in the text (None: text-only)."""

    def vision_inputs(self, encoded: Mapping[str, torch.Tensor]) -> VisionInputs:
        """The images of a processor's (or image processor's) output as one VisionInputs."""

    def image_token_counts(self, config, vision: VisionInputs) -> torch.Tensor:
        """(N,) long: how many image tokens each of `vision`'s images takes in the text."""

    def model_inputs(
        self, config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None
    ) -> dict[str, torch.Tensor]:
        """Forward keyword arguments for a (B, L) batch of rows whose images are `vision` (in order)."""

    def engine_prompt(self, config, token_ids: list[int]) -> list[int]:
        """The prompt vLLM takes beside the images, from a row whose image tokens are already expanded."""

    def backbone(self, model: nn.Module) -> nn.Module:
        """The module under the LM head whose last hidden state the critic's value head reads."""
