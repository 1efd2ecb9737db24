"""Wan 2.2 TI2V-5B's image conditioning, the `expand_timesteps` convention of diffusers'
`WanImageToVideoPipeline` (0.42.1) for a folder whose model_index.json sets it, so training, the latent
cache and `sample_video` feed the transformer what the pipeline feeds it.

No CLIP and no mask channels: the transformer's input is the noisy latents (48 channels, in = out) with
the FIRST latent frame replaced by the image's latent (`prepare_latents`: the normalised VAE mode of the
image alone, [B, z, 1, h, w]), mixed in as `(1 - mask) * condition + mask * latents` with a
`first_frame_mask` that is 0 on latent frame 0 and 1 elsewhere; the timestep is per token: 0 on the first
frame's tokens, t on the others (`(mask[0][0][:, ::2, ::2] * t).flatten()`, [B, tokens]; the transformer
embeds each token's timestep). The output's first frame is ignored (the pipeline replaces it by the
condition again before decoding), so training leaves it out of the loss: the first frame is given, not
denoised. The `::2` stride is the pipeline's own (it assumes the transformer's (1, 2, 2) patch, which
every Wan transformer has; wan/preflight.py refuses a TI2V folder with another).
"""

from __future__ import annotations

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.wan.conditioning import normalize_latents

TOKEN_STRIDE = 2  # the pipeline's `[:, ::2, ::2]`: one timestep per (1, 2, 2) patch


@torch.no_grad()
def first_frame_latents(vae: torch.nn.Module, first: Tensor) -> Tensor:
    """The condition [B, z, 1, h, w] float32: `prepare_latents`' `latent_condition` with
    `expand_timesteps` (video_condition = the image alone), the VAE's mode, normalised.
    first [B, 3, H, W] in [-1, 1]."""
    param = next(vae.parameters())
    video = first.unsqueeze(2).to(device=param.device, dtype=param.dtype)
    latent = vae.encode(video).latent_dist.mode().to(torch.float32)
    return normalize_latents(latent, vae.config)


def first_frame_mask(frames: int, height: int, width: int, device: torch.device) -> Tensor:
    """[1, 1, F', h, w] float32: 0 on the first latent frame (given), 1 elsewhere (denoised)."""
    mask = torch.ones(1, 1, frames, height, width, dtype=torch.float32, device=device)
    mask[:, :, 0] = 0
    return mask


def model_input(latents: Tensor, condition: Tensor, mask: Tensor) -> Tensor:
    """The latents with their first frame replaced by the condition, in the pipeline's arithmetic
    (`(1 - mask) * condition + mask * latents`; condition [B, z, 1, h, w] broadcast over the frames)."""
    return (1 - mask) * condition.to(latents) + mask * latents


def token_timesteps(mask: Tensor, timesteps: Tensor) -> Tensor:
    """[B, tokens]: per sample, 0 on the first frame's tokens and its timestep on the others, in the
    transformer's token order (frame, row, column). timesteps [B] (one per sample: training draws a sigma
    per clip; the pipeline's loop repeats one t)."""
    tokens = mask[0][0][:, ::TOKEN_STRIDE, ::TOKEN_STRIDE].flatten()
    return tokens[None] * timesteps.reshape(-1, 1)


def latent_frames(num_frames: int, temporal: int) -> int:
    """Latent frames of `num_frames` pixel frames: the first alone, then `temporal` per latent frame."""
    return (num_frames - 1) // temporal + 1
