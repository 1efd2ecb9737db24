"""What the LTX-2 transformer is conditioned on, computed with diffusers' own LTX-2 pipeline code
(0.42.1), so training, the latent cache and sampling feed the transformer what the pipelines feed it:

- prompts: Gemma 3's hidden states of every layer, stacked (`_get_gemma_prompt_embeds`, left padding to
  `max_sequence_length`), through the text connectors (`LTX2TextConnectors`): the video and audio prompt
  states and their attention mask. The cache stores the connectors' outputs (thousands of times smaller
  than Gemma's stacked states), so a filled cache never loads Gemma or the connectors to train;
- keyframes: each given frame (the first; and the last for interpolation) H.264 re-compressed at the
  model's CRF (`apply_image_conditioning_crf`, what the pipelines do to an image condition) and VAE-encoded
  alone (mode, normalised): the first replaces latent frame 0 (`apply_first_frame_conditioning`), the last
  is appended as keyframe tokens at the last latent index (`prepare_latents` of LTX2ConditionPipeline,
  with its keyframe coordinates);
- the training target: the clip's normalised VAE latents (mode).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor


def normalize_latents(latents: Tensor, vae: Any) -> Tensor:
    """The pipeline's `_normalize_latents` with the VAE's own statistics and scaling factor."""
    from diffusers import LTX2ImageToVideoPipeline

    return LTX2ImageToVideoPipeline._normalize_latents(
        latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    )


@torch.no_grad()
def encode_video_latents(vae: Any, video: Tensor) -> Tensor:
    """video [B, 3, F, H, W] in [-1, 1] -> normalised latents [B, C, F', h, w] (the VAE's mode)."""
    param = next(vae.parameters())
    latents = vae.encode(video.to(param.device, param.dtype)).latent_dist.mode()
    return normalize_latents(latents.float(), vae)


def crf_frames(frames: Tensor, crf: int) -> Tensor:
    """[B, 3, H, W] in [-1, 1] -> the same frames after the pipelines' H.264 re-compression at `crf`
    (0: unchanged), through uint8 pixels as a PIL image condition goes."""
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf

    if crf == 0:
        return frames
    pixels = ((frames.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    out = [
        torch.from_numpy(np.ascontiguousarray(apply_image_conditioning_crf(p.permute(1, 2, 0).numpy(), crf)))
        for p in pixels
    ]
    return (torch.stack(out).permute(0, 3, 1, 2).float() / 127.5 - 1).to(frames.device)


@torch.no_grad()
def encode_keyframes(vae: Any, frames: Tensor, crf: int) -> Tensor:
    """Given frames [B, 3, H, W] in [-1, 1] -> their latents [B, C, 1, h, w], each encoded alone after
    the CRF re-compression, as the pipelines encode an image condition."""
    return encode_video_latents(vae, crf_frames(frames, crf).unsqueeze(2))


def text_pipeline(text_encoder: Any, tokenizer: Any) -> Any:
    """An `LTX2ImageToVideoPipeline` holding only the text encoder and tokenizer: its own
    `encode_prompt` then encodes exactly as the pipeline does."""
    from diffusers import LTX2ImageToVideoPipeline

    return LTX2ImageToVideoPipeline(
        scheduler=None,
        vae=None,
        audio_vae=None,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        connectors=None,
        transformer=None,
        vocoder=None,
    )


@torch.no_grad()
def encode_prompts(
    text_encoder: Any, tokenizer: Any, connectors: Any, prompts: list[str], max_sequence_length: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(video states [B, L, Dv], audio states [B, L, Da], attention mask [B, L]): the connectors' outputs
    for Gemma's states of `prompts`, each encoded as the pipeline encodes it."""
    device = next(text_encoder.parameters()).device
    pipe = text_pipeline(text_encoder, tokenizer)
    embeds, mask, _, _ = pipe.encode_prompt(
        prompts, do_classifier_free_guidance=False, max_sequence_length=max_sequence_length, device=device
    )
    param = next(connectors.parameters())
    side = getattr(tokenizer, "padding_side", "left")
    video, audio, connector_mask = connectors(embeds.to(param.device, param.dtype), mask, padding_side=side)
    return video, audio, connector_mask


def keyframe_coords(
    vae_config: dict[str, Any], latent_index: int, latent_shape: tuple[int, int], fps: float, device
) -> Tensor:
    """[1, 3, h*w, 2] positions of a one-frame keyframe appended at `latent_index`: the condition
    pipeline's own `_prepare_keyframe_coords` (patch 1, the VAE's compression)."""
    from diffusers import LTX2ConditionPipeline

    spatial, temporal = compression(vae_config)
    shape = SimpleNamespace(
        transformer_spatial_patch_size=1,
        transformer_temporal_patch_size=1,
        vae_temporal_compression_ratio=temporal,
        vae_spatial_compression_ratio=spatial,
    )
    return LTX2ConditionPipeline._prepare_keyframe_coords(
        shape, 1, latent_shape[0], latent_shape[1], (latent_index - 1) * temporal + 1, 1, fps, device
    )


def compression(vae_config: dict[str, Any]) -> tuple[int, int]:
    """(spatial, temporal) compression of an `AutoencoderKLLTX2Video` config, as its __init__ computes
    them (explicit ratios win)."""
    scaling = 2 ** sum(vae_config.get("spatio_temporal_scaling", (True, True, True, True)))
    spatial = vae_config.get("spatial_compression_ratio") or vae_config.get("patch_size", 4) * scaling
    temporal = vae_config.get("temporal_compression_ratio") or vae_config.get("patch_size_t", 1) * scaling
    return int(spatial), int(temporal)


def pack(latents: Tensor) -> Tensor:
    """[B, C, F, h, w] -> tokens [B, F*h*w, C] (the pipeline's `_pack_latents`, patch 1)."""
    from diffusers import LTX2ImageToVideoPipeline

    return LTX2ImageToVideoPipeline._pack_latents(latents, 1, 1)
