"""Images in, `pixel_values`/`image_grid_thw` out, and the bookkeeping that ties them to token rows.

Image i owns `t_i * h_i * w_i` consecutive rows of `pixel_values` (its patch grid; a family whose
processor gives whole images uses (1, 1, 1)) and a run of image tokens in the text whose length the
family's adapter knows (vagen.models.adapters: `image_token_counts`).
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
    image_grid_thw: (N, 3) long, (t, h, w) patch grid of each image (P = sum of their products)
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


def encode_images(processor, adapter, images: Sequence[Image.Image | np.ndarray]) -> VisionInputs | None:
    """Images through the processor's image processor (its resize rule) into the family's VisionInputs
    (`adapter`: vagen.models.adapters); None when there are no images (text-only rows)."""
    if len(images) == 0:
        return None
    encoded = processor.image_processor(images=[as_pil(image) for image in images], return_tensors="pt")
    return adapter.vision_inputs(encoded)


def image_token_counts_per_row(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B,) number of image tokens in each row of `input_ids` (B, L)."""
    return (input_ids == image_token_id).sum(dim=1)


def images_per_row(input_ids: torch.Tensor, tokens_of_image: list[int], image_token_id: int) -> list[int]:
    """How many images belong to each row, matching its image tokens to images (of `tokens_of_image`
    tokens each) in order.

    Raises ValueError when the rows' pad tokens do not add up to whole images.
    """
    tokens_in_row = image_token_counts_per_row(input_ids, image_token_id).tolist()
    counts, image = [], 0
    for row, needed in enumerate(tokens_in_row):
        start = image
        while needed > 0 and image < len(tokens_of_image):
            needed -= tokens_of_image[image]
            image += 1
        if needed != 0:
            raise ValueError(
                f"row {row}: its {tokens_in_row[row]} image tokens do not match whole images "
                f"(image sizes in tokens: {tokens_of_image})"
            )
        counts.append(image - start)
    if image != len(tokens_of_image):
        raise ValueError(f"{len(tokens_of_image) - image} images left over after the last row's image tokens")
    return counts


def split_by_rows(
    input_ids: torch.Tensor, vision: VisionInputs | None, tokens_of_image: list[int], image_token_id: int
) -> list[VisionInputs | None]:
    """Per row of `input_ids` (B, L), the VisionInputs of that row's images (None for a row without);
    image i takes `tokens_of_image[i]` image tokens."""
    if vision is None:
        return [None] * input_ids.shape[0]
    counts = images_per_row(input_ids, tokens_of_image, image_token_id)
    starts = np.cumsum([0, *counts])
    return [
        vision.select(range(starts[row], starts[row + 1])) if counts[row] else None
        for row in range(len(counts))
    ]
