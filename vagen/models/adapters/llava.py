"""LLaVA (`LlavaForConditionalGeneration`): a fixed-size vision tower (CLIP / SigLIP) and a projector.

The image processor resizes every image to the tower's `image_size` square and gives it whole:
pixel_values (N, 3, S, S), one row per image, so each image's grid is (1, 1, 1) in VisionInputs. The
tower cuts it into `patch_size`-px patches; with `vision_feature_select_strategy` "default" its CLS
token is dropped and each patch becomes one image token, so every image takes `(S / patch)**2` tokens
and one token covers `patch_size` px (an image of exactly S px is never resized). Positions are the text
model's ordinary 1-D ones; with left padding (the HF engine) `generate` derives them from the attention
mask. vLLM's LLaVA processor, like Qwen-VL's, expands each image token it is given into the full run,
so its prompts carry one image token per image.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vagen.models.adapters.base import LANGUAGE_PROJECTIONS, VisionAdapter
from vagen.models.vision import VisionInputs


class Llava(VisionAdapter):
    context_only_tokens = ("<image>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
    lora_targets = rf"^(?!.*vision_tower).*\.{LANGUAGE_PROJECTIONS}$"
    # transformers 5 names the CLIP / SigLIP tower's weights without its `vision_model.` level, which
    # vLLM 0.32's LLaVA still expects (in the hub's llava-hf checkpoints too)
    engine_weight_prefixes = {"model.vision_tower.": "model.vision_tower.vision_model."}

    def merged_token_pixels(self, config) -> int:
        return config.vision_config.patch_size

    def vision_inputs(self, encoded: Mapping[str, torch.Tensor]) -> VisionInputs:
        pixel_values = encoded["pixel_values"]
        return VisionInputs(pixel_values, torch.ones(pixel_values.shape[0], 3, dtype=torch.long))

    def image_token_counts(self, config, vision: VisionInputs) -> torch.Tensor:
        if config.vision_feature_select_strategy != "default":
            raise ValueError(
                f"LLaVA vision_feature_select_strategy {config.vision_feature_select_strategy!r}: "
                "only 'default' (CLS token dropped) is supported"
            )
        side = config.vision_config.image_size // config.vision_config.patch_size
        return torch.full((len(vision),), side * side, dtype=torch.long)

    def model_inputs(
        self, config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None
    ) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if vision is not None:
            inputs["pixel_values"] = vision.pixel_values
        return inputs
