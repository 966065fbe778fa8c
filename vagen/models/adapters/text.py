"""Text-only causal LMs (any model_type without a vision tower)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from vagen.models.adapters.base import LANGUAGE_PROJECTIONS, language_backbone
from vagen.models.vision import VisionInputs


class TextOnly:
    context_only_tokens: tuple[str, ...] = ()
    lora_targets = rf"^.*\.{LANGUAGE_PROJECTIONS}$"
    engine_weight_prefixes: dict[str, str] = {}

    def merged_token_pixels(self, config) -> None:
        return None

    def image_token_id(self, config) -> None:
        return None

    def vision_inputs(self, encoded: Mapping[str, torch.Tensor]) -> VisionInputs:
        raise ValueError("images given but the model has no vision tower (text-only model)")

    def image_token_counts(self, config, vision: VisionInputs) -> torch.Tensor:
        raise ValueError("images given but the model has no vision tower (text-only model)")

    def model_inputs(
        self, config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None
    ) -> dict[str, torch.Tensor]:
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def engine_prompt(self, config, token_ids: list[int]) -> list[int]:
        return list(token_ids)

    def backbone(self, model: nn.Module) -> nn.Module:
        return language_backbone(model)
