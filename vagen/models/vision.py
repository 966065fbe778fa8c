"""Images in, `pixel_values`/`image_grid_thw` out, and the bookkeeping that ties them to token rows.

Qwen2-VL-family processors cut an image into 14-px patches, `P = sum_i t_i * h_i * w_i` patch rows of
`D = 3 * temporal_patch * 14 * 14` values, and each `merge x merge` block of patches becomes one
`<|image_pad|>` token in the text: image i occupies `t_i * h_i * w_i / merge**2` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image


@dataclass
class VisionInputs:
    """All images of a batch, in the order their pad tokens appear (row by row, left to right).

    pixel_values:   (P, D) float, patches of all images concatenated
    image_grid_thw: (N, 3) long, (t, h, w) patch grid of each image
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    def __len__(self) -> int:
        return self.image_grid_thw.shape[0]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> VisionInputs:
        return VisionInputs(self.pixel_values.to(device, dtype), self.image_grid_thw.to(device))

    def patch_counts(self) -> torch.Tensor:
        """(N,) patch rows of each image in `pixel_values`."""
        return self.image_grid_thw.prod(dim=-1)

    def token_counts(self, merge_size: int) -> torch.Tensor:
        """(N,) `<|image_pad|>` tokens of each image."""
        return self.patch_counts() // merge_size**2

    def select(self, image_indices: Sequence[int]) -> VisionInputs:
        """The images at `image_indices` (in that order)."""
        starts = torch.cumsum(self.patch_counts(), 0) - self.patch_counts()
        counts = self.patch_counts()
        rows = [torch.arange(starts[i], starts[i] + counts[i]) for i in image_indices]
        patch_rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
        return VisionInputs(self.pixel_values[patch_rows], self.image_grid_thw[list(image_indices)])

    @staticmethod
    def cat(parts: Sequence[VisionInputs]) -> VisionInputs:
        return VisionInputs(
            torch.cat([p.pixel_values for p in parts]), torch.cat([p.image_grid_thw for p in parts])
        )


def as_pil(image: Image.Image | np.ndarray) -> Image.Image:
    """An RGB PIL image from a PIL image or a uint8 (H, W, 3) array (what the envs render)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    return image.convert("RGB")


def encode_images(processor, images: Sequence[Image.Image | np.ndarray]) -> VisionInputs | None:
    """Patchify images with the processor's image processor (its resize rule: multiples of 28 px,
    min/max pixels); None when there are no images (text-only rows)."""
    if len(images) == 0:
        return None
    encoded = processor.image_processor(images=[as_pil(image) for image in images], return_tensors="pt")
    return VisionInputs(encoded["pixel_values"], encoded["image_grid_thw"].long())


def image_token_counts_per_row(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B,) number of `<|image_pad|>` tokens in each row of `input_ids` (B, L)."""
    return (input_ids == image_token_id).sum(dim=1)


def images_per_row(
    input_ids: torch.Tensor, vision: VisionInputs, image_token_id: int, merge_size: int
) -> list[int]:
    """How many of `vision`'s images belong to each row, matching pad tokens to images in order.

    Raises ValueError when the rows' pad tokens do not add up to whole images.
    """
    tokens_in_row = image_token_counts_per_row(input_ids, image_token_id).tolist()
    tokens_of_image = vision.token_counts(merge_size).tolist()
    counts, image = [], 0
    for row, needed in enumerate(tokens_in_row):
        start = image
        while needed > 0 and image < len(tokens_of_image):
            needed -= tokens_of_image[image]
            image += 1
        if needed != 0:
            raise ValueError(
                f"row {row}: its {tokens_in_row[row]} <|image_pad|> tokens do not match whole images "
                f"(image sizes in tokens: {tokens_of_image})"
            )
        counts.append(image - start)
    if image != len(tokens_of_image):
        raise ValueError(f"{len(tokens_of_image) - image} images left over after the last row's pad tokens")
    return counts


def split_by_rows(
    input_ids: torch.Tensor, vision: VisionInputs | None, image_token_id: int, merge_size: int
) -> list[VisionInputs | None]:
    """Per row of `input_ids` (B, L), the VisionInputs of that row's images (None for a row without)."""
    if vision is None:
        return [None] * input_ids.shape[0]
    counts = images_per_row(input_ids, vision, image_token_id, merge_size)
    starts = np.cumsum([0, *counts])
    return [
        vision.select(range(starts[row], starts[row + 1])) if counts[row] else None
        for row in range(len(counts))
    ]


def mm_token_type_ids(
    input_ids: torch.Tensor, image_token_id: int, video_token_id: int | None
) -> torch.Tensor:
    """(B, L) int: 0 text, 1 image pad, 2 video pad -- what Qwen-VL's `get_rope_index` reads to lay out
    M-RoPE positions (transformers >= 5 computes 3-D positions only when this is given)."""
    types = (input_ids == image_token_id).int()
    if video_token_id is not None:
        types = types + 2 * (input_ids == video_token_id).int()
    return types
