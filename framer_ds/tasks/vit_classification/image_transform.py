"""The image transform of `vit_classification`: a PIL image -> the normalised tensor the ViT takes,
with the train-time augmentations (pad + random crop, flip).

Why its own module: it replaces torchvision's transforms (torchvision is deliberately not a
dependency, see image_folder.py) and is applied wherever an image meets the model: training,
evaluation and `framer-ds sample` (`VitClassificationTask.image_transform`), not only to indexed folders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from PIL import Image


class ImageTransform:
    """PIL image -> normalised float32 CHW tensor, with optional train-time pad+crop and flip.

    The augmentation draws from `generator`: the training set passes each image's own (seeded by
    seed, epoch and index, framer_ds/data/item_draws.py), so a resumed run replays the same
    augmentations whatever the loader had read ahead when the checkpoint saved torch's RNG, and at any
    `num_workers`. Without one (ad-hoc use) it draws from torch's global RNG; Python's `random` and
    numpy are never used.
    """

    def __init__(
        self,
        image_size: int,
        num_channels: int,
        mean: Sequence[float],
        std: Sequence[float],
        train: bool,
        random_crop_padding: int = 0,
        hflip: bool = False,
        padding_mode: Literal["constant", "edge"] = "constant",
    ) -> None:
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}; set it to the model's input size.")
        if num_channels not in (1, 3):
            raise ValueError(
                f"num_channels must be 1 (grayscale) or 3 (RGB), got {num_channels}; set it to the "
                "model's number of input channels."
            )
        if len(mean) != num_channels or len(std) != num_channels:
            raise ValueError(
                f"mean and std need one value per channel ({num_channels}), got {len(mean)} and "
                f"{len(std)}; e.g. mean=[0.5]*{num_channels}, std=[0.5]*{num_channels}."
            )
        if any(s <= 0 for s in std):
            raise ValueError(f"every std must be > 0, got {list(std)}; a zero std divides by zero.")
        if random_crop_padding < 0:
            raise ValueError(
                f"random_crop_padding must be >= 0, got {random_crop_padding}; use 0 to disable."
            )
        if padding_mode not in ("constant", "edge"):
            raise ValueError(f"padding_mode must be 'constant' or 'edge', got {padding_mode!r}.")
        self.image_size = image_size
        self.num_channels = num_channels
        self.mode = "L" if num_channels == 1 else "RGB"
        self.mean = torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1)
        self.train = train
        self.random_crop_padding = random_crop_padding
        self.hflip = hflip
        self.padding_mode = padding_mode

    def __repr__(self) -> str:
        return (
            f"ImageTransform(image_size={self.image_size}, num_channels={self.num_channels}, "
            f"train={self.train}, random_crop_padding={self.random_crop_padding}, hflip={self.hflip})"
        )

    def __call__(self, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
        if image.mode != self.mode:
            image = image.convert(self.mode)
        size = (self.image_size, self.image_size)
        if image.size != size:
            # Pillow's bicubic resize is antialiased when shrinking (its filter support widens).
            image = image.resize(size, Image.Resampling.BICUBIC)
        array = np.array(image, dtype=np.uint8)  # a copy: torch.from_numpy warns on read-only arrays
        pixels = torch.from_numpy(array)
        pixels = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
        pixels = pixels.to(torch.float32).div_(255.0)
        if self.train:
            pixels = self._augment(pixels, generator)
        return (pixels - self.mean) / self.std

    def _augment(self, pixels: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Pad-then-random-crop (torchvision RandomCrop(padding)) and a p=0.5 horizontal flip, done
        before normalisation so a zero fill is black, as with torchvision on PIL images."""
        pad = self.random_crop_padding
        if pad > 0:
            mode = "constant" if self.padding_mode == "constant" else "replicate"
            padded = torch.nn.functional.pad(pixels.unsqueeze(0), (pad, pad, pad, pad), mode=mode)[0]
            top = int(torch.randint(0, 2 * pad + 1, (1,), generator=generator).item())
            left = int(torch.randint(0, 2 * pad + 1, (1,), generator=generator).item())
            pixels = padded[:, top : top + self.image_size, left : left + self.image_size].contiguous()
        if self.hflip and torch.rand(1, generator=generator).item() < 0.5:
            pixels = pixels.flip(-1)
        return pixels
