"""Mask overlays: what the model sees as drivable on fixed validation samples, as PNGs.

One image per sample: a column per view (the last frame), the ground truth tinted blue on top, the
prediction below (blue: road found, red: road predicted where there is none, yellow: road missed).
Under ZeRO-3 every forward is a collective, so every rank runs the same forwards and rank 0 writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

MIN_SIDE = 128
ROAD, RED, YELLOW = np.array([30, 120, 255]), np.array([230, 40, 40]), np.array([250, 210, 30])


def to_uint8_image(pixels: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """A normalised [3, H, W] tensor back to [H, W, 3] uint8."""
    values = pixels.float().cpu() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    return (values.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()


def tint(image: np.ndarray, where: np.ndarray, colour: np.ndarray, strength: float = 0.5) -> np.ndarray:
    out = image.astype(np.float32)
    out[where] = (1 - strength) * out[where] + strength * colour
    return out.astype(np.uint8)


def overlay_panel(
    images: list[np.ndarray], truth: list[np.ndarray], predicted: list[np.ndarray]
) -> Image.Image:
    """Views side by side: truth row above, prediction row below (boolean masks [H, W] per view)."""
    top = [tint(img, t, ROAD) for img, t in zip(images, truth, strict=True)]
    bottom = []
    for img, t, p in zip(images, truth, predicted, strict=True):
        shown = tint(img, p & t, ROAD)
        shown = tint(shown, p & ~t, RED)
        bottom.append(tint(shown, ~p & t, YELLOW))
    panel = np.concatenate([np.concatenate(top, axis=1), np.concatenate(bottom, axis=1)], axis=0)
    image = Image.fromarray(panel)
    scale = max(1, -(-MIN_SIDE // images[0].shape[0]))
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST) if scale > 1 else image


def write_overlays(
    items: list[dict[str, torch.Tensor]],
    logits: torch.Tensor,
    names: list[str],
    out_dir: Path,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> list[Path]:
    """One PNG per item (`logits` [N, F, V, H, W]; the last labelled frame is drawn)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for item, sample_logits, name in zip(items, logits, names, strict=True):
        last = item["pixel_values"][-1]  # [V, 3, H, W]
        truth = item["masks"][-1] > 0.5
        predicted = sample_logits[-1].float().cpu() > 0
        views = range(last.shape[0])
        panel = overlay_panel(
            [to_uint8_image(last[v], mean, std) for v in views],
            [truth[v].numpy() for v in views],
            [predicted[v].numpy() for v in views],
        )
        path = out_dir / f"{name}.png"
        panel.save(path)
        written.append(path)
    return written
