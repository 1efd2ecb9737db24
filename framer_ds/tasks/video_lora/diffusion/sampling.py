"""Sampling an SVD video (image-to-video or first/last-frame interpolation) with a LoRA-tuned UNet.

`StableVideoDiffusionPipeline.__call__` conditions on the first frame only, so interpolation needs its
own loop; it is the pipeline's loop (Euler, v-prediction, Karras sigmas, per-frame guidance ramp)
with our conditioning tensors, and it reuses the pipeline's `decode_latents`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.diffusion.framer_conditioning import framer_conditioning
from framer_ds.tasks.video_lora.diffusion.svd_conditioning import (
    added_time_ids,
    clip_image_embeddings,
    conditioning_latents,
    interpolation_conditioning,
)

GuidanceSchedule = Literal["linear", "middle_max"]
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


@dataclass
class FramerSampling:
    """Sampling a Framer model (`framer_model.FramerModel` as the denoiser): Framer's conditioning
    (`framer_conditioning`) with `mask_token`, and the ControlNet on `controlnet_cond` heatmaps
    [1,F,3,H,W] at `conditioning_scale` for the steps whose fraction i/steps lies in `step_range`
    (Framer's `controlnet_step_range`); None heatmaps: the ControlNet is skipped (no points)."""

    mask_token: Tensor
    controlnet_cond: Tensor | None = None
    conditioning_scale: float = 1.0
    step_range: tuple[float, float] = (0.0, 1.0)


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
    framer: FramerSampling | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(image embeddings, conditional latents, unconditional latents, first-frame latents) for
    image-to-video, SVD interpolation (mask channel appended) or Framer's convention. The first frame's
    latents draw their noise from `generator` before the last frame's, as the pipelines do."""
    image_emb = clip_image_embeddings(parts.image_encoder, first[None])
    first_lat = conditioning_latents(
        parts.vae, first[None], noise_aug_strength, generator=generator, tile_size=tile_size
    )
    if framer is not None:
        if last is None:
            raise ValueError("a Framer model interpolates: pass the last frame")
        last_lat = conditioning_latents(
            parts.vae, last[None], noise_aug_strength, generator=generator, tile_size=tile_size
        )
        image_emb = torch.cat([image_emb, clip_image_embeddings(parts.image_encoder, last[None])], dim=1)
        cond = framer_conditioning(first_lat, last_lat, framer.mask_token, num_frames)
        zeros = torch.zeros_like(first_lat)
        uncond = framer_conditioning(zeros, zeros, framer.mask_token, num_frames)
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
    framer: FramerSampling | None = None,
    guidance_schedule: GuidanceSchedule = "linear",
    on_step: Callable[[], Any] | None = None,
) -> Tensor:
    """first/last: [3,H,W] in [-1,1]; returns [T,3,H,W] in [-1,1]. The UNet takes 9 input channels
    when `last` is given (noisy + conditioning latents + mask). `guidance_schedule`: how the guidance
    goes from min to max over the frames (`guidance_scales`). `on_step`: called after each denoising step
    (a progress bar's `update`). `framer`: Framer's conventions (the
    pipeline `StableVideoDiffusionInterpControlPipeline.__call__`): CLIP of first and last frame, the
    mask token on missing frames, the mask 1 there, zero latents and embeddings unconditionally."""
    device = first.device
    dtype = next(parts.unet.parameters()).dtype
    image_emb, cond, uncond, first_lat = conditional_and_unconditional(
        parts, first, last, num_frames, noise_aug_strength, generator, tile_size, framer
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
        control = controlnet_inputs(framer, i, num_inference_steps, guided, device, dtype)
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
