"""What the frozen VAE and CLIP encoder make of a batch: the only inputs the UNet's loss needs.

One type serves three sources, so the loss code never asks where a batch came from: pixel clips from
videos, image pairs (two real frames, the middle ones without ground truth), and entries of the
latent cache (the same tensors, encoded once and read back from disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from framer_ds.tasks.video_lora.shared.cache_key import cache_basics, files_fingerprint
from framer_ds.tasks.video_lora.shared.protocol import CachedBatch


def svd_conditioning():
    """diffusers' SVD pipeline module is imported only when a video run starts: registering the task
    (for `framer-ds tasks` / `validate`) stays light and prints no transformers warnings."""
    from framer_ds.tasks.video_lora.svd import conditioning as module

    return module


@dataclass
class EncodedClip(CachedBatch):
    target: Tensor  # [B,T,C,h,w] scaled VAE latents: the diffusion x0
    first: Tensor  # [B,C,h,w] unscaled conditioning latents of the (noise-augmented) first frame
    image_emb: Tensor  # [B,1,D] CLIP embedding of the first frame
    cond_sigma: Tensor  # [B] conditioning-noise strength used for `first`/`last` (an added time id)
    fps: Tensor  # [B] fps the clip plays at (an added time id unless the config fixes one)
    last: Tensor | None = None  # [B,C,h,w] for interpolation
    frame_weights: Tensor | None = None  # [B,T] loss weight per frame; None = every frame counts
    last_image_emb: Tensor | None = None  # [B,1,D] CLIP embedding of the last frame (Framer's convention)
    motion_bucket: Tensor | None = None  # [B] per-clip motion bucket (model.motion_bucket from_data)

    def unet_conditioning(self, num_frames: int) -> tuple[Tensor, Tensor | None]:
        """(conditioning latents, mask or None): first frame only, or first + last with a mask."""
        if self.last is None:
            return self.first, None
        return svd_conditioning().interpolation_conditioning(self.first, self.last, num_frames)


@dataclass
class FrozenEncoders:
    """The frozen VAE and CLIP image encoder with the VAE's memory settings."""

    vae: torch.nn.Module
    image_encoder: torch.nn.Module
    chunk_size: int | None = None  # frames per VAE call
    tile_size: int | None = None  # see svd/conditioning.vae_posterior


@torch.no_grad()
def encode_clips(
    encoders: FrozenEncoders,
    video: Tensor,
    fps: Tensor,
    cond_sigma: Tensor,
    interpolation: bool,
    generator: torch.Generator | list[torch.Generator] | None = None,
    embed_last: bool = False,
) -> EncodedClip:
    """Pixel clips [B,T,3,H,W] in [-1,1]. With a generator the target is the latent mode and every
    noise draw comes from it (deterministic eval); without, posterior samples as SVD trained.
    `embed_last`: also the CLIP embedding of the last frame (a Framer base conditions on both)."""
    svd, first, vae, tile = svd_conditioning(), video[:, 0], encoders.vae, encoders.tile_size

    def conditioning(frames: Tensor) -> Tensor:
        return svd.conditioning_latents(vae, frames, cond_sigma, generator=generator, tile_size=tile)

    return EncodedClip(
        target=svd.target_latents(
            vae,
            video,
            chunk_size=encoders.chunk_size,
            sample=generator is None,
            generator=generator,
            tile_size=tile,
        ),
        first=conditioning(first),
        image_emb=svd.clip_image_embeddings(encoders.image_encoder, first),
        cond_sigma=cond_sigma,
        fps=fps,
        last=conditioning(video[:, -1]) if interpolation else None,
        last_image_emb=(
            svd.clip_image_embeddings(encoders.image_encoder, video[:, -1]) if embed_last else None
        ),
    )


@torch.no_grad()
def encode_pairs(
    encoders: FrozenEncoders,
    pairs: Tensor,
    num_frames: int,
    fps: Tensor,
    cond_sigma: Tensor,
    generator: torch.Generator | list[torch.Generator] | None = None,
    embed_last: bool = False,
) -> EncodedClip:
    """Image pairs [B,2,3,H,W] (start, end) -> a T-frame clip whose middle has no ground truth.

    The noisy input still needs T frames, so the middle targets are a linear blend of the two end
    latents; their loss weight is zero, so the blend is never taught. What pairs teach is the ends:
    reproduce the given frames from the conditioning, the part of interpolation a pair can supervise.
    """
    ends = encode_clips(encoders, pairs, fps, cond_sigma, True, generator, embed_last)
    alpha = torch.linspace(0, 1, num_frames, device=pairs.device).view(1, -1, 1, 1, 1)
    ends.target = torch.lerp(ends.target[:, :1].float(), ends.target[:, 1:].float(), alpha).to(ends.target)
    weights = torch.zeros(pairs.shape[0], num_frames, device=pairs.device)
    weights[:, 0] = weights[:, -1] = 1.0
    ends.frame_weights = weights
    return ends


def example_encoded_batch(
    config: Any, svd_dir: Any, micro_batch_size: int, embed_last: bool = False
) -> dict[str, Tensor]:
    """What `framer-ds plan` runs forward and backward: an encoded micro-batch of the largest shapes, from
    the config and the VAE's and image encoder's config.json (no weights). Without a cache training encodes
    pixels first under no_grad, in chunks: a transient this batch leaves out."""
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import CLIPVisionConfig

    vae = AutoencoderKLTemporalDecoder.load_config(svd_dir, subfolder="vae")
    embedding = CLIPVisionConfig.from_pretrained(svd_dir, subfolder="image_encoder").projection_dim
    data, k = config.data, micro_batch_size
    scale = 2 ** (len(vae["block_out_channels"]) - 1)
    latent = (vae["latent_channels"], data.height // scale, data.width // scale)
    batch = {
        "target": torch.zeros(k, data.num_frames, *latent),
        "first": torch.zeros(k, *latent),
        "image_emb": torch.zeros(k, 1, embedding),
        "cond_sigma": torch.full((k,), 0.02),
        "fps": torch.full((k,), float(config.model.fps or 7)),
    }
    if config.model.base.mode == "interpolation":
        batch["last"] = torch.zeros(k, *latent)
    if embed_last:  # the last frame's CLIP embedding (Framer's conditioning)
        batch["last_image_emb"] = torch.zeros(k, 1, embedding)
    if data.layout == "image_pairs":
        batch["frame_weights"] = torch.ones(k, data.num_frames)
    return batch


def describe_cache(
    config: Any, dataset: Dataset, split: str, copies: int, svd_dir: Path, dtype: str
) -> dict[str, Any]:
    """Everything that decides a split's cached tensors of an SVD-family base: the cache key is its hash."""
    options, data = config.model, config.data
    motion = getattr(dataset, "motion_fingerprint", None)  # through wrappers
    return {
        **cache_basics(config, dataset, split, copies, dtype),
        "svd": files_fingerprint(svd_dir, ("vae", "image_encoder")),
        "cond_noise": [options.edm.cond_noise_mean, options.edm.cond_noise_std],
        "vae_tile_size": options.vae_tile_size,
        # from_data entries store their bucket and training prefers it to the fixed one: never mix them
        "motion_from_data": options.motion_bucket == "from_data",
        # model.motion_bucket from_data: each entry stores its bucket, which the training quantiles decide
        **({"motion_buckets": motion()} if motion is not None else {}),
        "data": data.model_dump(mode="json", exclude={"cache", "val_fraction", "source", "tracks"}),
        # entries then store their clip placement; the tracks themselves are applied at load
        **({"placement": True} if data.tracks is not None else {}),
    }
