"""Wan image-to-video sampling: `WanImageToVideoPipeline.__call__`'s denoising loop and decode (diffusers
0.42.1) on framer_ds's own flow-matching sampler (`diffusion/flow_matching.py`), so `framer-ds sample`
and training-time samples need no pipeline object (the transformer may be peft-wrapped or sharded) and
still give the pipeline's frames for the same seed and inputs.

The pipeline's loop, step by step: latents ~ N(0, I) float32 [B, z, F', h, w] drawn from the generator
(`randn_tensor`, before anything else draws); per step the transformer sees concat(latents, condition)
in its dtype and the timestep sigma * 1000; with guidance > 1 it is called a second time with the
negative prompt embeddings (same image embeddings) and the two are combined as
uncond + guidance * (cond - uncond); the scheduler's Euler step; at the end the latents are
de-normalised, decoded by the VAE and mapped from [-1, 1] to [0, 1] (clamped).

Schedulers: the tiny bases carry `FlowMatchEulerDiscreteScheduler` (exactly this sampler). diffusers'
conversion of the real Wan 2.1/2.2 checkpoints saves `UniPCMultistepScheduler(use_flow_sigmas=True,
flow_shift=...)`: same flow, same shift, but a multistep solver, so on those folders this Euler sampler
does not reproduce the pipeline's frames (`pipeline_defaults(...).sampler_is_pipelines` says which).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from framer_ds.tasks.video_lora.diffusion.flow_matching import (
    NUM_TRAIN_TIMESTEPS,
    euler_step,
    inference_sigmas,
    sigmas_to_timesteps,
)
from framer_ds.tasks.video_lora.wan.conditioning import denormalize_latents

EULER = "FlowMatchEulerDiscreteScheduler"
UNIPC = "UniPCMultistepScheduler"
# FlowMatchEulerDiscreteScheduler options that change its schedule away from a static shift.
_UNSUPPORTED_EULER = {
    "use_dynamic_shifting": False,
    "invert_sigmas": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "stochastic_sampling": False,
}


def scheduler_shift(scheduler_config: dict[str, Any]) -> float:
    """The static flow shift a Wan scheduler config samples with: Euler's `shift`, or UniPC's `flow_shift`
    (only with `use_flow_sigmas`, the flow-matching mode the Wan conversions save). Anything else is
    refused with the option that stands in the way, so a schedule this sampler cannot follow never
    samples silently different frames."""
    name = scheduler_config.get("_class_name", EULER)
    if name == EULER:
        for key, default in _UNSUPPORTED_EULER.items():
            if scheduler_config.get(key, default) != default:
                raise ValueError(
                    f"scheduler option {key}={scheduler_config[key]!r} is not supported; use {default!r}"
                )
        return float(scheduler_config.get("shift", 1.0))
    if name == UNIPC and scheduler_config.get("use_flow_sigmas"):
        return float(scheduler_config.get("flow_shift", 1.0))
    raise ValueError(
        f"scheduler {name} is not a flow-matching scheduler; use {EULER} or {UNIPC} with use_flow_sigmas"
    )


@dataclass(frozen=True)
class WanSamplingDefaults:
    """What `WanImageToVideoPipeline.__call__` uses for a base folder when the caller passes nothing."""

    guidance_scale: float
    guidance_scale_2: float | None  # Wan 2.2's low-noise expert (None: same as guidance_scale)
    shift: float
    negative_prompt: str
    max_sequence_length: int
    num_inference_steps: int
    height: int
    width: int
    num_frames: int
    scheduler_class: str
    boundary_ratio: float | None  # Wan 2.2: where the high-noise expert hands over (None: one transformer)
    sampler_is_pipelines: bool  # True when our Euler sampler IS the folder's scheduler


def pipeline_defaults(base_folder: Path | str) -> WanSamplingDefaults:
    """The pipeline's defaults for this base: guidance 5.0, max_sequence_length 512 and the rest read from
    `WanImageToVideoPipeline.__call__`'s own signature (so they follow the installed diffusers), the shift
    from the folder's scheduler config, the negative prompt "" (`encode_prompt`: `negative_prompt or ""`;
    the long negative prompt in diffusers' Wan docs is an example the caller passes, not a default)."""
    from diffusers import WanImageToVideoPipeline

    folder = Path(base_folder)
    scheduler_file = folder / "scheduler" / "scheduler_config.json"
    if not scheduler_file.is_file():
        raise FileNotFoundError(
            f"{scheduler_file} is missing; point at a diffusers Wan folder (model_index.json)"
        )
    scheduler_config = json.loads(scheduler_file.read_text())
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    call = {
        name: p.default for name, p in inspect.signature(WanImageToVideoPipeline.__call__).parameters.items()
    }
    name = scheduler_config.get("_class_name", EULER)
    return WanSamplingDefaults(
        guidance_scale=float(call["guidance_scale"]),
        guidance_scale_2=call["guidance_scale_2"],
        shift=scheduler_shift(scheduler_config),
        negative_prompt=call["negative_prompt"] or "",
        max_sequence_length=int(call["max_sequence_length"]),
        num_inference_steps=int(call["num_inference_steps"]),
        height=int(call["height"]),
        width=int(call["width"]),
        num_frames=int(call["num_frames"]),
        scheduler_class=name,
        boundary_ratio=index.get("boundary_ratio"),
        sampler_is_pipelines=name == EULER,
    )


def _parameter(module: torch.nn.Module) -> torch.Tensor:
    return next(module.parameters())


@torch.no_grad()
def decode_latents(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents [B, z, F', h, w] -> frames [B, F, 3, H, W] float32 in [0, 1]: the pipeline's
    de-normalise, `vae.decode`, then `VideoProcessor.postprocess_video`'s (x * 0.5 + 0.5).clamp(0, 1)."""
    param = _parameter(vae)
    latents = denormalize_latents(latents.to(device=param.device, dtype=param.dtype), vae.config)
    video = vae.decode(latents, return_dict=False)[0]
    return (video * 0.5 + 0.5).clamp(0, 1).float().permute(0, 2, 1, 3, 4)


def _velocity(transformer, model_input, timestep, text, image) -> torch.Tensor:
    return transformer(
        hidden_states=model_input,
        timestep=timestep,
        encoder_hidden_states=text,
        encoder_hidden_states_image=image,
        return_dict=False,
    )[0]


def _guided_velocity(
    transformer, model_input, timestep, text, negative, image, guidance: float
) -> torch.Tensor:
    """The pipeline's classifier-free guidance: two calls (not one batched call), then
    uncond + guidance * (cond - uncond); one call without negative embeddings. Whether to guide is the
    pipeline's `guidance_scale > 1` for the whole run, whatever the low-noise expert's own scale."""
    velocity = _velocity(transformer, model_input, timestep, text, image)
    if negative is None:
        return velocity
    uncond = _velocity(transformer, model_input, timestep, negative, image)
    return uncond + guidance * (velocity - uncond)


@torch.no_grad()
def sample_video(
    transformer: torch.nn.Module,
    vae: torch.nn.Module,
    scheduler_config: dict[str, Any],
    prompt_embeds: torch.Tensor,
    negative_prompt_embeds: torch.Tensor | None,
    image_embeds: torch.Tensor | None,
    condition: torch.Tensor,
    num_inference_steps: int,
    guidance_scale: float,
    generator: torch.Generator | None,
    shift: float | None = None,
    transformer_2: torch.nn.Module | None = None,
    boundary_ratio: float | None = None,
    guidance_scale_2: float | None = None,
) -> torch.Tensor:
    """Frames [B, F, 3, H, W] float32 in [0, 1] (F = (F' - 1) * temporal + 1), the pipeline's loop.

    prompt_embeds [B, L, D] (`encode_prompts`); negative_prompt_embeds the same shape, needed when
    guidance_scale > 1 (the pipeline's `do_classifier_free_guidance`); image_embeds as `encode_images`
    returns them (None for a transformer without `image_dim`, Wan 2.2); condition [B, 4 + z, F', h, w]
    (`condition_latents`); shift None = the scheduler config's. The generator draws the initial noise
    only, on its own device, exactly as the pipeline's `randn_tensor` does.

    Wan 2.2's two experts: with `boundary_ratio` (the folder's model_index value) steps whose timestep is
    >= boundary_ratio * num_train_timesteps run `transformer` (high noise) at guidance_scale, the rest
    `transformer_2` (low noise) at guidance_scale_2 (default: guidance_scale), as the pipeline switches."""
    guided = guidance_scale > 1
    if guided and negative_prompt_embeds is None:
        raise ValueError(
            f"guidance_scale {guidance_scale} > 1 needs negative_prompt_embeds (encode the prompt '')"
        )
    if (transformer_2 is None) != (boundary_ratio is None):
        raise ValueError(
            "transformer_2 and boundary_ratio go together (Wan 2.2's two experts); pass both or neither"
        )
    shift = scheduler_shift(scheduler_config) if shift is None else shift
    dtype, device = _parameter(transformer).dtype, condition.device
    num_train = int(scheduler_config.get("num_train_timesteps", NUM_TRAIN_TIMESTEPS))
    sigmas = inference_sigmas(num_inference_steps, shift, num_train).to(device)
    batch, _, frames, height, width = condition.shape
    shape = (batch, vae.config.z_dim, frames, height, width)
    latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
    text = prompt_embeds.to(device, dtype)
    negative = negative_prompt_embeds.to(device, dtype) if guided else None
    image = None if image_embeds is None else image_embeds.to(device, dtype)
    boundary = None if boundary_ratio is None else boundary_ratio * num_train
    for index in range(num_inference_steps):
        timestep = sigmas_to_timesteps(sigmas[index : index + 1], num_train)
        high_noise = boundary is None or timestep.item() >= boundary
        model = transformer if high_noise else transformer_2
        guidance = guidance_scale if high_noise or guidance_scale_2 is None else guidance_scale_2
        model_input = torch.cat([latents, condition], dim=1).to(dtype)
        velocity = _guided_velocity(
            model, model_input, timestep.expand(batch), text, negative, image, guidance
        )
        latents = euler_step(latents, velocity, sigmas[index], sigmas[index + 1])
    return decode_latents(vae, latents)
