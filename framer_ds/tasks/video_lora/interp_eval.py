"""Held-out interpolation metrics inside the eval loop (`model.interp_eval`).

Each held-out clip of an eval batch is sampled on its own from its first (and last) frame, with a
generator seeded from the clip's id, so its sample is the same whatever the rank count, the batch it
lands in and the step; the metrics are per clip (`diffusion/interp_metrics.py`) and the loop sums them
over the eval set and the ranks. Under ZeRO-3 every UNet forward is a collective: the loop's eval
loader gives every rank the same number of equally sized batches (accelerate's even_batches repeats
samples to fill the last one; `gather_for_metrics` drops them), so every rank runs the same number of
sampling forwards.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from framer_ds.config.errors import ConfigProblem
from framer_ds.diffusion.interp_metrics import interpolation_metrics
from framer_ds.tasks.video_lora.config import InterpEvalOptions

if TYPE_CHECKING:  # diffusers and transformers load when sampling starts, not when a config validates
    from framer_ds.diffusion.sampling import SamplerParts

CLIP_CHUNK = 16  # frames per CLIP forward when measuring clip_distance


def interp_eval_problems(config: Any) -> list[ConfigProblem]:
    """What `model.interp_eval.enabled` needs: pixel clips with real middle frames, SVD's sampler."""
    model, data = config.model, config.data
    if not model.interp_eval.enabled:
        return []
    key, problems = "model.interp_eval.enabled", []
    if data.layout == "image_pairs":
        problems.append(ConfigProblem(key, "image pairs have no real middle frames to compare with"))
    if data.num_frames < 3:
        problems.append(ConfigProblem(key, "needs data.num_frames >= 3 (first, middle, last)"))
    if data.cache.enabled:
        problems.append(ConfigProblem(key, "needs the pixel clips; it does not run from data.cache yet"))
    if getattr(model, "base", "svd") != "svd":
        problems.append(ConfigProblem(key, "samples with SVD's sampler; a Framer base is not supported yet"))
    return problems


def clip_seed(video_id: str, seed: int) -> int:
    """A clip's own sampling seed: the same on every rank and at every evaluation."""
    return (zlib.crc32(str(video_id).encode()) + seed) % (2**63)


@torch.no_grad()
def sample_clips(
    parts: SamplerParts,
    pixels: Tensor,
    video_ids: list[str],
    fps: list[float],
    motion_bucket_ids: list[int],
    options: InterpEvalOptions,
    interpolation: bool,
    tile_size: int | None = None,
) -> Tensor:
    """[B,T,3,H,W] real clips in [-1,1] -> [B,T,3,H,W] samples from their first (and last) frames."""
    from framer_ds.diffusion.sampling import sample_video

    device, num_frames = pixels.device, pixels.shape[1]
    samples = []
    for index in range(pixels.shape[0]):
        clip = pixels[index].float()
        generator = torch.Generator(device=device).manual_seed(clip_seed(video_ids[index], options.seed))
        samples.append(
            sample_video(
                parts,
                clip[0],
                clip[-1] if interpolation else None,
                num_frames,
                float(fps[index]),
                int(motion_bucket_ids[index]),
                noise_aug_strength=options.noise_aug_strength,
                num_inference_steps=options.num_inference_steps,
                min_guidance_scale=options.min_guidance_scale,
                max_guidance_scale=options.max_guidance_scale,
                generator=generator,
                decode_chunk_size=options.decode_chunk_size,
                tile_size=tile_size,
            )
        )
    return torch.stack(samples)


def interp_eval_values(
    parts: SamplerParts,
    pixels: Tensor,
    video_ids: list[str],
    fps: list[float],
    motion_bucket_ids: list[int],
    options: InterpEvalOptions,
    interpolation: bool,
    tile_size: int | None = None,
) -> dict[str, Tensor]:
    """Per-clip metric values [B] for one eval batch (every rank calls it with its batch)."""
    from framer_ds.diffusion.svd_conditioning import clip_image_embeddings

    samples = sample_clips(
        parts, pixels, video_ids, fps, motion_bucket_ids, options, interpolation, tile_size
    )

    def embed(frames: Tensor) -> Tensor:
        chunks = [clip_image_embeddings(parts.image_encoder, c) for c in frames.split(CLIP_CHUNK)]
        return torch.cat(chunks).flatten(1)

    return interpolation_metrics(samples, pixels.float(), embed if options.clip_distance else None)


def interp_eval_batch(parts: Any, batch: dict[str, Any], options: Any) -> dict[str, Tensor]:
    """Every clip of an eval batch sampled from its own first (and last) frame and compared with the real
    clip: its fps and motion bucket as training conditioned on them (`model.fps`, `model.motion_bucket`)."""
    pixels = batch["pixel_values"]
    count = pixels.shape[0]
    fps = [float(options.fps)] * count if options.fps is not None else batch["fps"].float().tolist()
    buckets = batch.get("motion_bucket_id")
    buckets = buckets.tolist() if buckets is not None else [options.fixed_motion_bucket] * count
    return interp_eval_values(
        parts,
        pixels,
        list(batch["video_id"]),
        fps,
        buckets,
        options.interp_eval,
        interpolation=options.mode == "interpolation",
        tile_size=options.vae_tile_size,
    )
