"""Framer's conditioning convention, as its interpolation pipeline builds it (aim-uofa/Framer
`pipelines/pipeline_stable_video_diffusion_interp_control.py`, `__call__`; ComfyUI-FramerWrapper's copy
is the same):

- conditioning latents `[first, mask_token x (F-2), last]` along frames: the unscaled VAE modes of the
  noise-augmented first and last frames, Framer's learned `unet.mask_token` [1,1,C,1,1] on every
  missing frame;
- a mask channel concatenated after them, 1 on the MISSING frames and 0 on the two given ones (our own
  interpolation mode marks the given ones instead);
- CLIP image embeddings of the first AND the last frame concatenated along the sequence: [B, 2, D];
- the unconditional half of classifier-free guidance: zero first/last latents (the middle keeps the
  mask token, the mask channel is unchanged) and zero embeddings for both frames.

The UNet input is then `cat([c_in * noisy, cond], dim=2)`: 4 + 4 + 1 = 9 channels, like our own
interpolation mode; only the conditioning values differ. Everything else (EDM, added time ids, noise
augmentation, CLIP preprocessing) is SVD's, in `svd_conditioning`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def framer_conditioning(first: Tensor, last: Tensor, mask_token: Tensor, num_frames: int) -> Tensor:
    """first/last [B,C,h,w] unscaled conditioning latents -> [B,F,C+1,h,w]: latents + Framer's mask
    channel (1 on missing frames). Zero first/last give the unconditional input."""
    if num_frames < 2:
        raise ValueError(f"Framer interpolation needs num_frames >= 2 (first and last), got {num_frames}")
    if first.shape != last.shape:
        raise ValueError(f"first/last latents differ in shape: {first.shape} vs {last.shape}")
    b, c, h, w = first.shape
    token = mask_token.to(device=first.device, dtype=first.dtype).reshape(1, 1, c, 1, 1)
    middle = token.expand(b, num_frames - 2, c, h, w)
    latents = torch.cat([first[:, None], middle, last[:, None]], dim=1)
    mask = torch.ones(b, num_frames, 1, h, w, dtype=first.dtype, device=first.device)
    mask[:, 0] = 0.0
    mask[:, -1] = 0.0
    return torch.cat([latents, mask], dim=2)


def framer_image_embeddings(first_emb: Tensor, last_emb: Tensor) -> Tensor:
    """[B,1,D] CLIP embeddings of the first and the last frame -> [B,2,D] (the pipeline's
    `torch.cat([image_embeddings, image_end_embeddings], dim=1)`)."""
    return torch.cat([first_emb, last_emb], dim=1)


def framer_dropout(
    first: Tensor,
    last: Tensor,
    image_emb: Tensor,
    p_image: float,
    p_latents: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Classifier-free-guidance dropout in Framer's terms: a dropped image embedding zeroes BOTH frames'
    embeddings, dropped latents zero BOTH given frames (never the mask token or the mask channel), so
    a drop of both is exactly the pipeline's unconditional half. Independent per sample, like
    `svd/conditioning.conditioning_dropout`."""
    b = first.shape[0]
    gen_device = generator.device if generator is not None else first.device
    u = torch.rand(2, b, generator=generator, device=gen_device).to(first.device)
    keep_img = (u[0] >= p_image).to(image_emb.dtype).view(b, 1, 1)
    keep_lat = (u[1] >= p_latents).to(first.dtype).view(b, 1, 1, 1)
    return first * keep_lat, last * keep_lat, image_emb * keep_img


@dataclass
class FramerSampling:
    """Sampling a Framer model (`framer_model.FramerModel` as the denoiser) in SVD's loop, as its
    `SamplingConditioning` (svd/sampling.py): Framer's conditioning (`framer_conditioning`) with
    `mask_token`, and the ControlNet on `controlnet_cond` heatmaps [1,F,3,H,W] at `conditioning_scale`
    for the steps whose fraction i/steps lies in `step_range` (Framer's `controlnet_step_range`); None
    heatmaps: the ControlNet is skipped (no points)."""

    mask_token: Tensor
    controlnet_cond: Tensor | None = None
    conditioning_scale: float = 1.0
    step_range: tuple[float, float] = (0.0, 1.0)

    def image_embeddings(self, first: Tensor, last: Tensor) -> Tensor:
        return framer_image_embeddings(first, last)

    def latents(self, first: Tensor, last: Tensor, num_frames: int) -> tuple[Tensor, Tensor]:
        """Zero first/last latents unconditionally: the middle keeps the mask token, the mask stays."""
        zeros = torch.zeros_like(first)
        return (
            framer_conditioning(first, last, self.mask_token, num_frames),
            framer_conditioning(zeros, zeros, self.mask_token, num_frames),
        )

    def denoiser_inputs(
        self, step: int, num_steps: int, guided: bool, device: torch.device, dtype: torch.dtype
    ) -> dict[str, Any]:
        return controlnet_inputs(self, step, num_steps, guided, device, dtype)

    def record(self) -> dict[str, Any]:
        """The ControlNet's scale and step range, for the sample record."""
        return {"controlnet_scale": self.conditioning_scale, "controlnet_step_range": list(self.step_range)}


def controlnet_inputs(
    framer: FramerSampling | None,
    step: int,
    num_steps: int,
    guided: bool,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The ControlNet keywords of denoising step `step` of `num_steps`: none without Framer heatmaps;
    the heatmaps (doubled for guidance) inside `framer.step_range`, None (ControlNet skipped) outside."""
    if framer is None or framer.controlnet_cond is None:
        return {}
    low, high = framer.step_range
    heatmaps = torch.cat([framer.controlnet_cond] * 2) if guided else framer.controlnet_cond
    in_range = low <= step / num_steps < high
    control: dict[str, Any] = {"controlnet_cond": heatmaps.to(device, dtype) if in_range else None}
    control["conditioning_scale"] = framer.conditioning_scale
    return control
