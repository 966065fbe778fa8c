"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: one family, its differences read from the config.

The processor cuts an image into `patch`-px patches (14 for Qwen2/2.5-VL, 16 for Qwen3-VL) and each
`merge x merge` block (merge 2) becomes one `<|image_pad|>`: one token covers `patch * merge` px
(28 / 32), and image i takes `t_i * h_i * w_i / merge**2` pads. pixel_values (P, D) holds the patches,
image_grid_thw (N, 3) each image's (t, h, w) patch grid. Positions are M-RoPE (3-D): the model lays them
out itself (`get_rope_index`) from `mm_token_type_ids`, which transformers >= 5 needs to compute them.
vLLM's Qwen-VL input processor expands every `<|image_pad|>` it is given into the image's full run (an
already expanded run would be expanded again: 34 prompt tokens became 49, log-probs 0.3 nats off), so
its prompts carry one pad per image.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vagen.models.adapters.base import LANGUAGE_PROJECTIONS, VisionAdapter
from vagen.models.vision import VisionInputs


def mm_token_type_ids(
    input_ids: torch.Tensor, image_token_id: int, video_token_id: int | None
) -> torch.Tensor:
    """(B, L) int: 0 text, 1 image pad, 2 video pad -- what `get_rope_index` reads to lay out M-RoPE."""
    types = (input_ids == image_token_id).int()
    if video_token_id is not None:
        types = types + 2 * (input_ids == video_token_id).int()
    return types


class QwenVL(VisionAdapter):
    context_only_tokens = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    lora_targets = rf"^(?!.*visual).*\.{LANGUAGE_PROJECTIONS}$"  # the vision tower is `visual`

    def merged_token_pixels(self, config) -> int:
        vision = config.vision_config
        return vision.patch_size * vision.spatial_merge_size

    def vision_inputs(self, encoded: Mapping[str, torch.Tensor]) -> VisionInputs:
        return VisionInputs(encoded["pixel_values"], encoded["image_grid_thw"].long())

    def image_token_counts(self, config, vision: VisionInputs) -> torch.Tensor:
        return vision.patch_counts() // config.vision_config.spatial_merge_size**2

    def model_inputs(
        self, config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None
    ) -> dict[str, torch.Tensor]:
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "mm_token_type_ids": mm_token_type_ids(
                input_ids, config.image_token_id, getattr(config, "video_token_id", None)
            ),
        }
        if vision is not None:
            inputs["pixel_values"] = vision.pixel_values
            inputs["image_grid_thw"] = vision.image_grid_thw
        return inputs
