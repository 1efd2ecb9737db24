"""Wan image-to-video sampling: `WanImageToVideoPipeline.__call__`'s denoising loop and decode (diffusers
0.42.1) without a pipeline object, so `framer-ds sample` and training-time samples can run a peft-wrapped or
sharded transformer and still give the pipeline's frames for the same seed and inputs.

The pipeline's loop, step by step: latents ~ N(0, I) float32 [B, z, F', h, w] drawn from the generator
(`randn_tensor`, before anything else draws); per step the transformer sees concat(latents, condition)
in its dtype and the scheduler's timestep; with guidance > 1 it is called a second time with the
negative prompt embeddings (same image embeddings) and the two are combined as
uncond + guidance * (cond - uncond); the scheduler's step; at the end the latents are de-normalised,
decoded by the VAE and mapped from [-1, 1] to [0, 1] (clamped).

Schedulers: the step is the base folder's own scheduler, as the pipeline's is. diffusers' conversion of
the real Wan 2.1/2.2 checkpoints saves `UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=...)`, a
multistep solver that is not written again here: `load_base_scheduler(folder)` builds diffusers' own class
from the folder's scheduler_config.json and `sample_video(..., scheduler=...)` calls its `set_timesteps`
and `step` as the pipeline does. framer_ds's own Euler steps (`wan/flow_matching.py`, exact against
`FlowMatchEulerDiscreteScheduler`) run only when the config names that scheduler and no instance is given
(the tiny bases).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils.torch_utils import randn_tensor
from torch import Tensor

from framer_ds.tasks.video_lora.wan import ti2v
from framer_ds.tasks.video_lora.wan.conditioning import denormalize_latents
from framer_ds.tasks.video_lora.wan.flow_matching import (
    NUM_TRAIN_TIMESTEPS,
    euler_step,
    inference_sigmas,
    sigmas_to_timesteps,
)

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


def scheduler_name(scheduler_config: dict[str, Any]) -> str:
    """The config's `_class_name` (a saved scheduler_config.json has it). A config taken from an instance
    (`dict(scheduler.config)`) has none: read as Euler's only when it holds no UniPC option, so a UniPC
    config never samples as Euler with shift 1.0 silently."""
    name = scheduler_config.get("_class_name")
    if name is not None:
        return name
    if "use_flow_sigmas" in scheduler_config or "flow_shift" in scheduler_config:
        raise ValueError(
            "scheduler config without _class_name holds UniPC options; pass scheduler=<the scheduler> "
            "(load_base_scheduler(folder)) or the folder's scheduler_config.json, which names its class"
        )
    return EULER


def scheduler_shift(scheduler_config: dict[str, Any]) -> float:
    """The static flow shift a Wan scheduler config samples with: Euler's `shift`, or UniPC's `flow_shift`
    (only with `use_flow_sigmas`, the flow-matching mode the Wan conversions save). Anything else is
    refused with the option that stands in the way, so a schedule this sampler cannot follow never
    samples silently different frames."""
    name = scheduler_name(scheduler_config)
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


def read_scheduler_config(base_folder: Path | str) -> dict[str, Any]:
    """The base folder's scheduler/scheduler_config.json, or one line saying where to point instead."""
    scheduler_file = Path(base_folder) / "scheduler" / "scheduler_config.json"
    if not scheduler_file.is_file():
        raise FileNotFoundError(
            f"{scheduler_file} is missing; point at a diffusers Wan folder (model_index.json)"
        )
    return json.loads(scheduler_file.read_text())


def scheduler_from_config(scheduler_config: dict[str, Any], shift: float | None = None) -> SchedulerMixin:
    """diffusers' own scheduler class named by `_class_name`, built from the config as `from_pretrained`
    builds the pipeline's; `shift` replaces the config's (`shift` for Euler, `flow_shift` for UniPC, as
    diffusers' Wan docs swap it with `from_config(..., flow_shift=...)`). Only the flow-matching
    schedulers `scheduler_shift` accepts: a DDPM-style config would sample noise of another kind."""
    import diffusers

    scheduler_shift(scheduler_config)
    name = scheduler_name(scheduler_config)
    overrides = {} if shift is None else {"shift" if name == EULER else "flow_shift": float(shift)}
    return getattr(diffusers, name).from_config(scheduler_config, **overrides)


def load_base_scheduler(base_folder: Path | str, shift: float | None = None) -> SchedulerMixin:
    """The scheduler `WanImageToVideoPipeline.from_pretrained(base_folder)` gets (for the hub folders
    `UniPCMultistepScheduler` with flow sigmas), to pass to `sample_video(..., scheduler=...)`: the class
    model_index.json names (from_pretrained picks it there, not from the config's `_class_name`) built
    from scheduler/scheduler_config.json."""
    config = read_scheduler_config(base_folder)
    index_file = Path(base_folder) / "model_index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    library, name = index.get("scheduler", [None, None])
    if library == "diffusers" and name:
        config = {**config, "_class_name": name}
    return scheduler_from_config(config, shift)


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
    scheduler_class: str  # the folder's scheduler, the one `sample_video` steps with
    boundary_ratio: float | None  # Wan 2.2: where the high-noise expert hands over (None: one transformer)
    expand_timesteps: bool = False  # Wan 2.2 TI2V-5B: first-frame latents, per-token timesteps (wan/ti2v.py)


def pipeline_defaults(base_folder: Path | str) -> WanSamplingDefaults:
    """The pipeline's defaults for this base: guidance 5.0, max_sequence_length 512 and the rest read from
    `WanImageToVideoPipeline.__call__`'s own signature (so they follow the installed diffusers), the shift
    from the folder's scheduler config, the negative prompt "" (`encode_prompt`: `negative_prompt or ""`;
    the long negative prompt in diffusers' Wan docs is an example the caller passes, not a default)."""
    from diffusers import WanImageToVideoPipeline

    folder = Path(base_folder)
    scheduler_config = read_scheduler_config(folder)
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    call = {
        name: p.default for name, p in inspect.signature(WanImageToVideoPipeline.__call__).parameters.items()
    }
    name = scheduler_name(scheduler_config)
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
        expand_timesteps=bool(index.get("expand_timesteps", False)),
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


def _transformer_inputs(
    latents: Tensor, condition: Tensor, timestep: Tensor, mask: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """(hidden states, timestep) of one step: concat(latents, condition) and t per sample, or with
    `expand_timesteps` (`mask`: wan/ti2v.first_frame_mask) the first frame replaced by the condition and
    t per token, 0 on the first frame's."""
    batch = latents.shape[0]
    if mask is None:
        return torch.cat([latents, condition], dim=1).to(dtype), timestep.expand(batch)
    return ti2v.model_input(latents, condition, mask).to(dtype), ti2v.token_timesteps(
        mask, timestep.expand(batch)
    )


def _steps(
    scheduler: SchedulerMixin | None,
    scheduler_config: dict[str, Any],
    num_inference_steps: int,
    shift: float | None,
    device: torch.device,
) -> tuple[torch.Tensor, Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The run's timesteps and its step(index, velocity, latents): a fresh copy of the given scheduler
    (the caller's keeps its state) or of the one the config names, stepped as the pipeline steps it; our
    Euler steps only for a FlowMatchEulerDiscreteScheduler config with no instance given."""
    if scheduler is None and scheduler_name(scheduler_config) == EULER:
        shift = scheduler_shift(scheduler_config) if shift is None else shift
        num_train = int(scheduler_config.get("num_train_timesteps", NUM_TRAIN_TIMESTEPS))
        sigmas = inference_sigmas(num_inference_steps, shift, num_train).to(device)
        timesteps = sigmas_to_timesteps(sigmas[:-1], num_train)
        return timesteps, lambda index, velocity, latents: euler_step(
            latents, velocity, sigmas[index], sigmas[index + 1]
        )
    if scheduler is not None:  # an instance's config does not name its class
        scheduler_config = {**scheduler.config, "_class_name": type(scheduler).__name__}
    solver = scheduler_from_config(scheduler_config, shift)
    solver.set_timesteps(num_inference_steps, device=device)
    timesteps = solver.timesteps
    return timesteps, lambda index, velocity, latents: solver.step(
        velocity, timesteps[index], latents, return_dict=False
    )[0]


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
    scheduler: SchedulerMixin | None = None,
    on_step: Callable[[], Any] | None = None,
    num_latent_frames: int | None = None,
) -> torch.Tensor:
    """Frames [B, F, 3, H, W] float32 in [0, 1] (F = (F' - 1) * temporal + 1), the pipeline's loop.
    `on_step`: called after each denoising step (a progress bar's `update`).

    prompt_embeds [B, L, D] (`encode_prompts`); negative_prompt_embeds the same shape, needed when
    guidance_scale > 1 (the pipeline's `do_classifier_free_guidance`); image_embeds as `encode_images`
    returns them (None for a transformer without `image_dim`, Wan 2.2); condition [B, 4 + z, F', h, w]
    (`condition_latents`), or with `num_latent_frames` (Wan 2.2 TI2V-5B, `expand_timesteps`) the first
    frame's latents [B, z, 1, h, w] (`ti2v.first_frame_latents`) for latents of that many frames, which
    replace the first latent frame at every step and before the decode, as the pipeline does. The
    generator draws the initial noise only, on its own device, exactly as the pipeline's `randn_tensor`
    does.

    Scheduler: `scheduler` (`load_base_scheduler(folder)`) when given, else the one scheduler_config
    names (diffusers' class; our Euler steps for FlowMatchEulerDiscreteScheduler); shift None = its own.

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
    dtype, device = _parameter(transformer).dtype, condition.device
    timesteps, step = _steps(scheduler, scheduler_config, num_inference_steps, shift, device)
    batch, _, frames, height, width = condition.shape
    frames = frames if num_latent_frames is None else num_latent_frames
    shape = (batch, vae.config.z_dim, frames, height, width)
    latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
    mask = None if num_latent_frames is None else ti2v.first_frame_mask(frames, height, width, device)
    text = prompt_embeds.to(device, dtype)
    negative = negative_prompt_embeds.to(device, dtype) if guided else None
    image = None if image_embeds is None else image_embeds.to(device, dtype)
    config = scheduler_config if scheduler is None else scheduler.config
    num_train = int(config.get("num_train_timesteps", NUM_TRAIN_TIMESTEPS))
    boundary = None if boundary_ratio is None else boundary_ratio * num_train
    for index, timestep in enumerate(timesteps):
        high_noise = boundary is None or timestep.item() >= boundary
        model = transformer if high_noise else transformer_2
        guidance = guidance_scale if high_noise or guidance_scale_2 is None else guidance_scale_2
        model_input, model_timestep = _transformer_inputs(latents, condition, timestep, mask, dtype)
        velocity = _guided_velocity(model, model_input, model_timestep, text, negative, image, guidance)
        latents = step(index, velocity, latents)
        if on_step is not None:
            on_step()
    if mask is not None:
        latents = ti2v.model_input(latents, condition, mask)
    return decode_latents(vae, latents)
