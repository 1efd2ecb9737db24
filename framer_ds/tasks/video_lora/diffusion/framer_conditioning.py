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
    `svd_conditioning.conditioning_dropout`."""
    b = first.shape[0]
    gen_device = generator.device if generator is not None else first.device
    u = torch.rand(2, b, generator=generator, device=gen_device).to(first.device)
    keep_img = (u[0] >= p_image).to(image_emb.dtype).view(b, 1, 1)
    keep_lat = (u[1] >= p_latents).to(first.dtype).view(b, 1, 1, 1)
    return first * keep_lat, last * keep_lat, image_emb * keep_img
