"""Sampling an SVD video (image-to-video or first/last-frame interpolation) with a LoRA-tuned UNet.

`StableVideoDiffusionPipeline.__call__` conditions on the first frame only, so interpolation needs its
own loop; it is the pipeline's loop (Euler, v-prediction, Karras sigmas, per-frame guidance ramp)
with our conditioning tensors, and it reuses the pipeline's `decode_latents`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.shared.options import GuidanceSchedule
from framer_ds.tasks.video_lora.svd.conditioning import (
    added_time_ids,
    clip_image_embeddings,
    conditioning_latents,
    interpolation_conditioning,
)

GUIDANCE_SCHEDULES: tuple[str, ...] = ("linear", "middle_max")


def guidance_scales(
    min_scale: float, max_scale: float, num_frames: int, schedule: GuidanceSchedule = "linear"
) -> Tensor:
    """float32 [num_frames]: the per-frame classifier-free guidance scale.

    'linear': SVD's ramp, `linspace(min, max, F)` (min on the first frame, max on the last).
    'middle_max': Framer's `middle_max_guidance` (pipeline_stable_video_diffusion_interp_control.py
    lines 555-560): the ramp followed by its mirror image, `[g, flip(g)]` (2F values), linearly resized
    to F with `align_corners=False`, so frame i gets `(h[2i] + h[2i+1]) / 2` of that 2F sequence: small
    at both ends (the given frames), largest in the middle; exactly `max` only on the middle frame of
    an odd F, never at the ends (frame 0 gets `min + (max - min) / (2 (F - 1))`)."""
    ramp = torch.linspace(min_scale, max_scale, num_frames)
    if schedule == "linear":
        return ramp
    if schedule == "middle_max":
        both = torch.cat([ramp, ramp.flip(0)])[None, None]  # [1, 1, 2F]
        resized = torch.nn.functional.interpolate(both, size=num_frames, mode="linear", align_corners=False)
        return resized[0, 0]
    raise ValueError(f"unknown guidance schedule {schedule!r}; use one of {', '.join(GUIDANCE_SCHEDULES)}")


class SamplingConditioning(Protocol):
    """A family's own conditioning convention in SVD's sampling loop (Framer's, `FramerSampling`): the
    loop encodes the given frames as SVD does and asks this for the rest, so the SVD code never names a
    family that extends it."""

    def image_embeddings(self, first: Tensor, last: Tensor) -> Tensor:
        """CLIP embeddings [1,1,D] of the first and the last frame -> what the denoiser attends to."""

    def latents(self, first: Tensor, last: Tensor, num_frames: int) -> tuple[Tensor, Tensor]:
        """(conditional, unconditional) conditioning latents [1,F,C,h,w] from the given frames' latents."""

    def denoiser_inputs(
        self, step: int, num_steps: int, guided: bool, device: torch.device, dtype: torch.dtype
    ) -> dict[str, Any]:
        """Extra keywords of the denoiser at step `step` of `num_steps` (doubled for guidance)."""

    def record(self) -> dict[str, Any]:
        """What `framer-ds sample`'s record says of this conditioning (its settings, by name)."""


@dataclass
class SamplerParts:
    """What sampling needs. `denoiser` is what gets called (in training: the prepared DDP/DeepSpeed
    model, so ZeRO-3 gathers its partitions); `unet` is the bare UNet whose config and
    `add_embedding` describe the added time ids and whose parameters give the compute dtype."""

    denoiser: Callable[..., Any]
    unet: torch.nn.Module
    vae: torch.nn.Module
    image_encoder: torch.nn.Module
    scheduler: Any

    @classmethod
    def from_pipeline(cls, pipe) -> SamplerParts:
        return cls(pipe.unet, pipe.unet, pipe.vae, pipe.image_encoder, pipe.scheduler)


def decode_latents(vae: torch.nn.Module, latents: Tensor, num_frames: int, chunk_size: int) -> Tensor:
    """[B,T,C,h,w] latents -> [B,C,T,H,W] float pixels, by the pipeline's own `decode_latents` (it
    reads nothing but `self.vae`), so sampling decodes exactly as diffusers does."""
    from diffusers import StableVideoDiffusionPipeline

    return StableVideoDiffusionPipeline.decode_latents(
        SimpleNamespace(vae=vae), latents.to(vae.dtype), num_frames, chunk_size
    )


def conditional_and_unconditional(
    parts: SamplerParts,
    first: Tensor,
    last: Tensor | None,
    num_frames: int,
    noise_aug_strength: float,
    generator: torch.Generator | None,
    tile_size: int | None,
    conditioning: SamplingConditioning | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(image embeddings, conditional latents, unconditional latents, first-frame latents) for
    image-to-video, SVD interpolation (mask channel appended) or a family's own convention
    (`conditioning`). The first frame's latents draw their noise from `generator` before the last
    frame's, as the pipelines do."""
    image_emb = clip_image_embeddings(parts.image_encoder, first[None])
    first_lat = conditioning_latents(
        parts.vae, first[None], noise_aug_strength, generator=generator, tile_size=tile_size
    )
    if conditioning is not None:
        if last is None:
            raise ValueError("this model interpolates (Framer): pass the last frame")
        last_lat = conditioning_latents(
            parts.vae, last[None], noise_aug_strength, generator=generator, tile_size=tile_size
        )
        last_emb = clip_image_embeddings(parts.image_encoder, last[None])
        image_emb = conditioning.image_embeddings(image_emb, last_emb)
        cond, uncond = conditioning.latents(first_lat, last_lat, num_frames)
    elif last is not None:
        last_lat = conditioning_latents(
            parts.vae, last[None], noise_aug_strength, generator=generator, tile_size=tile_size
        )
        cond, mask = interpolation_conditioning(first_lat, last_lat, num_frames)
        uncond = torch.cat(
            [torch.zeros_like(cond), mask.to(cond.dtype)], dim=2
        )  # CFG drops content, not layout
        cond = torch.cat([cond, mask.to(cond.dtype)], dim=2)
    else:
        cond = first_lat[:, None].expand(-1, num_frames, -1, -1, -1)
        uncond = torch.zeros_like(cond)
    return image_emb, cond, uncond, first_lat


@torch.no_grad()
def sample_video(
    parts: SamplerParts,
    first: Tensor,
    last: Tensor | None,
    num_frames: int,
    fps: float,
    motion_bucket_id: int = 127,
    noise_aug_strength: float = 0.02,
    num_inference_steps: int = 25,
    min_guidance_scale: float = 1.0,
    max_guidance_scale: float = 3.0,
    generator: torch.Generator | None = None,
    decode_chunk_size: int = 8,
    tile_size: int | None = None,
    conditioning: SamplingConditioning | None = None,
    guidance_schedule: GuidanceSchedule = "linear",
    on_step: Callable[[], Any] | None = None,
) -> Tensor:
    """first/last: [3,H,W] in [-1,1]; returns [T,3,H,W] in [-1,1]. The UNet takes 9 input channels
    when `last` is given (noisy + conditioning latents + mask). `guidance_schedule`: how the guidance
    goes from min to max over the frames (`guidance_scales`). `on_step`: called after each denoising step
    (a progress bar's `update`). `conditioning`: a family's own convention (Framer's `FramerSampling`,
    as the pipeline `StableVideoDiffusionInterpControlPipeline.__call__`: CLIP of first and last frame,
    the mask token on missing frames, the mask 1 there, zero latents and embeddings unconditionally, and
    its ControlNet's keywords per step)."""
    device = first.device
    dtype = next(parts.unet.parameters()).dtype
    image_emb, cond, uncond, first_lat = conditional_and_unconditional(
        parts, first, last, num_frames, noise_aug_strength, generator, tile_size, conditioning
    )
    time_ids = added_time_ids(fps, motion_bucket_id, noise_aug_strength, 1, parts.unet, device=device)
    guided = max_guidance_scale > 1.0
    if guided:
        image_emb = torch.cat([torch.zeros_like(image_emb), image_emb])
        cond, time_ids = torch.cat([uncond, cond]), torch.cat([time_ids, time_ids])

    scheduler = parts.scheduler
    scheduler.set_timesteps(num_inference_steps, device=device)
    shape = (1, num_frames, parts.vae.config.latent_channels, *first_lat.shape[-2:])
    latents = (
        torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        * scheduler.init_noise_sigma
    )
    guidance = guidance_scales(min_guidance_scale, max_guidance_scale, num_frames, guidance_schedule)
    guidance = guidance.to(device).view(1, -1, 1, 1, 1)
    for i, t in enumerate(scheduler.timesteps):
        model_in = torch.cat([latents] * 2) if guided else latents
        model_in = torch.cat([scheduler.scale_model_input(model_in, t), cond.float()], dim=2)
        control = (
            {}
            if conditioning is None
            else conditioning.denoiser_inputs(i, num_inference_steps, guided, device, dtype)
        )
        pred = parts.denoiser(
            model_in.to(dtype),
            t,
            encoder_hidden_states=image_emb.to(dtype),
            added_time_ids=time_ids.to(dtype),
            return_dict=False,
            **control,
        )[0].float()
        if guided:
            pred_uncond, pred_cond = pred.chunk(2)
            pred = pred_uncond + guidance * (pred_cond - pred_uncond)
        latents = scheduler.step(pred, t, latents).prev_sample
        if on_step is not None:
            on_step()
    frames = decode_latents(parts.vae, latents, num_frames, decode_chunk_size)  # [1,C,T,H,W]
    return frames[0].permute(1, 0, 2, 3).clamp(-1, 1)
