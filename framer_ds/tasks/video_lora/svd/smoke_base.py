"""`framer-ds smoke`'s stand-in for a Stable Video Diffusion folder: the architecture its config.json
files describe (the folder's own, or the one framer_ds ships for the repo), width- and depth-tiny and
random, saved in the stable-video-diffusion-img2vid layout so the run loads it with `from_pretrained`.

What stays is what the recipe's code paths depend on: the UNet's block types and their count (so its
downsampling, and with the VAE's the size rule of 64), in/out channels, frame count, added-time-id
layout; the VAE's block count (8x) and latent channels and scaling factor; the CLIP encoder's image
size, patch and projection (= the UNet's cross-attention width). What shrinks is width and depth:
32 channels per block (diffusers' GroupNorm(32) floor), one layer per block, two attention heads,
two CLIP layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from framer_ds.compat import fix_processor_class, image_processor_class
from framer_ds.storage.atomic import build_once
from framer_ds.tasks.smoke import read_config
from framer_ds.tasks.video_lora.shared.smoke_encoders import EMBED, tiny_clip_config

MARKER = ".framer_smoke_svd_complete"
WIDTH = 32  # channels per block: diffusers' resnets normalise in 32 groups
TIME_EMBED = 32  # one added time id's embedding (256 in SVD)


def tiny_unet_config(config: dict[str, Any]) -> dict[str, Any]:
    """A UNetSpatioTemporalConditionModel (or Framer's ControlNet) config at the tiny width and depth."""
    blocks = len(config["block_out_channels"])
    ids = config["projection_class_embeddings_input_dim"] // config["addition_time_embed_dim"]
    return {
        **config,
        "block_out_channels": [WIDTH] * blocks,
        "num_attention_heads": [2] * blocks,
        "layers_per_block": 1,
        "transformer_layers_per_block": 1,
        "cross_attention_dim": EMBED,
        "addition_time_embed_dim": TIME_EMBED,
        "projection_class_embeddings_input_dim": ids * TIME_EMBED,
    }


def tiny_vae_config(config: dict[str, Any]) -> dict[str, Any]:
    blocks = len(config["block_out_channels"])
    return {**config, "block_out_channels": [WIDTH] * blocks, "layers_per_block": 1}


def build_smoke_svd(architecture: Path, unet_config: dict[str, Any] | None = None):
    """(unet, vae, image_encoder) of `architecture`'s SVD folder at the tiny size; `unet_config`: a
    shrunk UNet config to use instead of the folder's (Framer's 9-channel one)."""
    from diffusers import AutoencoderKLTemporalDecoder, UNetSpatioTemporalConditionModel
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    unet = UNetSpatioTemporalConditionModel.from_config(
        unet_config or tiny_unet_config(read_config(architecture, "unet"))
    )
    vae = AutoencoderKLTemporalDecoder.from_config(tiny_vae_config(read_config(architecture, "vae")))
    clip = tiny_clip_config(read_config(architecture, "image_encoder"))
    for key in ("architectures", "model_type"):
        clip.pop(key, None)
    image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(**clip))
    return unet, vae, image_encoder


def create_smoke_svd(path: Path, architecture: Path) -> Path:
    """Build (once, atomically) the tiny SVD folder of `architecture` at `path`."""

    def build(staging: Path) -> None:
        from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline

        from framer_ds.tasks.video_lora.svd.tiny import SVD_SCHEDULER_CONFIG

        unet, vae, image_encoder = build_smoke_svd(architecture)
        StableVideoDiffusionPipeline(
            vae=vae,
            image_encoder=image_encoder,
            unet=unet,
            scheduler=EulerDiscreteScheduler(**SVD_SCHEDULER_CONFIG),
            feature_extractor=image_processor_class("CLIPImageProcessor")(),
        ).save_pretrained(staging)
        fix_processor_class(staging)

    return build_once(path, MARKER, build, "tiny SVD stand-in")
