"""A tiny random Stable Video Diffusion checkpoint, saved in the stable-video-diffusion-img2vid layout.

Tests (and CPU smoke runs) need the real classes, configs and `from_pretrained` paths without downloading
~10 GB: `create_tiny_svd` builds every component small and random and saves it through
`StableVideoDiffusionPipeline.save_pretrained`, so the folder (`unet/ vae/ image_encoder/
feature_extractor/ scheduler/ model_index.json`) loads exactly like the Hub repo does.

Shapes follow the real model where it matters: UNet in_channels 8 (4 noisy + 4 conditioning latents),
3 added-time ids, VAE downsampling 8x (4 encoder blocks) with 4 latent channels, CLIP input 224 px
(the pipeline hard-codes `_resize_with_antialiasing(image, (224, 224))`), image-embedding width ==
UNet cross_attention_dim.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLTemporalDecoder,
    EulerDiscreteScheduler,
    StableVideoDiffusionPipeline,
    UNetSpatioTemporalConditionModel,
)
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

from framer_ds.compat import fix_processor_class, image_processor_class
from framer_ds.storage.atomic import build_once

MARKER = ".framer_tiny_svd_complete"
EMBED_DIM = 32  # CLIP projection_dim == UNet cross_attention_dim (1024 in the real model)

# SVD's scheduler: the values of the stabilityai/stable-video-diffusion-img2vid(-xt) scheduler_config.json
# as diffusers' own SVD fast test reproduces them (tests/pipelines/stable_video_diffusion/
# test_stable_video_diffusion.py, get_dummy_components); sigma_min/sigma_max 0.002/700 are also the EDM
# discretisation of Stability's generative-models scripts/sampling (VERSION2SPECS["svd"]).
SVD_SCHEDULER_CONFIG: dict[str, object] = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "sigma_max": 700.0,
    "sigma_min": 0.002,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "timestep_type": "continuous",
    "trained_betas": None,
    "use_karras_sigmas": True,
}


# A ~100M-parameter UNet in SVD's block layout (the real one is 1.5B), for memory benchmarks of a LoRA on a
# frozen base: big enough that buffers sized for the whole model would show.
SVD_STYLE_100M_UNET: dict[str, object] = {
    "down_block_types": ("CrossAttnDownBlockSpatioTemporal",) * 3 + ("DownBlockSpatioTemporal",),
    "up_block_types": ("UpBlockSpatioTemporal",) + ("CrossAttnUpBlockSpatioTemporal",) * 3,
    "block_out_channels": (96, 192, 384, 384),
    "num_attention_heads": (3, 6, 12, 12),
    "cross_attention_dim": 1024,
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 3 * 256,
}


def _build_pipeline(
    seed: int, unet_overrides: dict[str, object] | None = None
) -> StableVideoDiffusionPipeline:
    torch.manual_seed(seed)
    unet_config: dict[str, object] = {
        "sample_size": 8,
        "in_channels": 8,
        "out_channels": 4,
        "down_block_types": ("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        "up_block_types": ("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        "block_out_channels": (32, 64),
        "layers_per_block": 1,
        "cross_attention_dim": EMBED_DIM,
        "num_attention_heads": (2, 4),
        "addition_time_embed_dim": 32,
        "projection_class_embeddings_input_dim": 3 * 32,
        "num_frames": 4,
        **(unet_overrides or {}),
    }
    vae = AutoencoderKLTemporalDecoder(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        block_out_channels=(32, 32, 32, 32),  # GroupNorm(32) in the decoder needs multiples of 32
        layers_per_block=1,
        latent_channels=4,
        sample_size=64,
    )
    image_encoder = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            image_size=224,
            patch_size=32,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            projection_dim=unet_config["cross_attention_dim"],
        )
    )
    return _assemble(UNetSpatioTemporalConditionModel(**unet_config), vae, image_encoder)


# The image encoder of stable-video-diffusion-img2vid(-xt): OpenCLIP ViT-H/14's vision tower with a
# 1024-wide projection (its image_encoder/config.json).
SVD_IMAGE_ENCODER = CLIPVisionConfig(
    image_size=224,
    patch_size=14,
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=16,
    projection_dim=1024,
    hidden_act="gelu",
)


# The VAE of stable-video-diffusion-img2vid(-xt) (its vae/config.json; diffusers' defaults are smaller).
SVD_VAE = {
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 4,
    "sample_size": 768,
    "scaling_factor": 0.18215,
    "force_upcast": True,
}


def _build_full_size_pipeline(seed: int) -> StableVideoDiffusionPipeline:
    """SVD at its real size: diffusers' default UNetSpatioTemporalConditionModel config IS SVD's UNet
    (1.5B), plus SVD's VAE and the ViT-H/14 image encoder."""
    torch.manual_seed(seed)
    return _assemble(
        UNetSpatioTemporalConditionModel(),
        AutoencoderKLTemporalDecoder(**SVD_VAE),
        CLIPVisionModelWithProjection(SVD_IMAGE_ENCODER),
    )


def _assemble(unet, vae, image_encoder) -> StableVideoDiffusionPipeline:
    # Default CLIPImageProcessor == SVD's feature_extractor config (224 px, OpenAI CLIP mean/std).
    feature_extractor = image_processor_class("CLIPImageProcessor")()
    scheduler = EulerDiscreteScheduler(**SVD_SCHEDULER_CONFIG)
    return StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=scheduler,
        feature_extractor=feature_extractor,
    )


def create_tiny_svd(path: Path, seed: int = 0, unet_overrides: dict[str, object] | None = None) -> Path:
    """Build (once) a tiny random SVD checkpoint at `path` and return `path`; `unet_overrides` replace UNet
    config fields (e.g. SVD_STYLE_100M_UNET), the image embedding following its cross_attention_dim.

    Idempotent: a finished folder carries a marker file and is returned as is. Atomic: everything is
    written into a sibling temp folder that is renamed into place, so a crash or a concurrent creator
    (e.g. several test workers) never leaves a half-written checkpoint behind.
    """

    def build(staging: Path) -> None:
        _build_pipeline(seed, unet_overrides).save_pretrained(staging)
        fix_processor_class(staging)

    return build_once(path, MARKER, build, "tiny SVD checkpoint")


def create_full_size_svd(path: Path, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Build (once) a RANDOM Stable Video Diffusion checkpoint of the real size (1.5B UNet, ViT-H image
    encoder, the SVD VAE) at `path`, saved in `dtype`: memory and speed benchmarks at the size users train
    (benchmarks/gpu/) without downloading the weights. Idempotent and atomic like `create_tiny_svd`."""

    def build(staging: Path) -> None:
        _build_full_size_pipeline(seed).to(dtype=dtype).save_pretrained(staging)
        fix_processor_class(staging)

    return build_once(path, MARKER, build, "full-size random SVD checkpoint")


def load_svd_components(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    variant: str | None = None,
) -> tuple[
    UNetSpatioTemporalConditionModel,
    AutoencoderKLTemporalDecoder,
    CLIPVisionModelWithProjection,
    object,
]:
    """(unet, vae, image_encoder, feature_extractor) loaded per subfolder, as users load the Hub weights.

    Works for a local folder or a Hub id (`stabilityai/stable-video-diffusion-img2vid-xt`, `variant="fp16"`).
    Everything is loaded in `dtype`; for fp16 training keep the VAE in fp32 yourself (the pipeline upcasts it
    when `vae.config.force_upcast`, because the SVD VAE overflows in fp16).
    """
    path = str(path)
    unet = UNetSpatioTemporalConditionModel.from_pretrained(
        path, subfolder="unet", torch_dtype=dtype, variant=variant
    )
    vae = AutoencoderKLTemporalDecoder.from_pretrained(
        path, subfolder="vae", torch_dtype=dtype, variant=variant
    )
    image_encoder = CLIPVisionModelWithProjection.from_pretrained(
        path, subfolder="image_encoder", dtype=dtype, variant=variant
    )
    feature_extractor = image_processor_class("CLIPImageProcessor").from_pretrained(
        path, subfolder="feature_extractor"
    )
    return unet, vae, image_encoder, feature_extractor
