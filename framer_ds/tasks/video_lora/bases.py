"""`model.base` of a video_lora run: the base model fine-tuned, one choice told apart by `name`, each
base with its own options, so that no config can hold an invalid combination (Framer in image-to-video
mode, Framer options on stock SVD). Each name is served by one base family (families/): svd and framer
by the SVD family (EDM, UNet), wan by the Wan family (rectified flow, DiT)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source


def _step_range_in_unit_interval(value: tuple[float, float]) -> tuple[float, float]:
    if not 0 <= value[0] <= value[1] <= 1:
        raise ValueError(f"need [lo, hi] with 0 <= lo <= hi <= 1, got {list(value)}")
    return value


StepRange = Annotated[tuple[float, float], AfterValidator(_step_range_in_unit_interval)]
"""Fractions of the sampling steps where Framer's ControlNet runs (its `controlnet_step_range`)."""


class SvdSource(Source):
    """Where the SVD components come from (VAE, CLIP image encoder, and the UNet of base svd)."""

    path: Path | None = Field(
        None, description="Local diffusers SVD directory (stable-video-diffusion-img2vid(-xt) layout)."
    )
    builtin: Literal["tiny_svd"] | None = Field(
        None, description="'tiny_svd': tiny random SVD components created in the cache (demo, tests)."
    )


class FramerSource(Source):
    """Where the Framer checkpoint (unet/ + controlnet/) comes from."""

    path: Path | None = Field(
        None, description="Local Framer directory with unet/ and controlnet/ (e.g. framer_512x320)."
    )
    builtin: Literal["tiny_framer"] | None = Field(
        None, description="'tiny_framer': a tiny random Framer checkpoint built in the cache (tests, demo)."
    )


VideoMode = Literal["image_to_video", "interpolation"]


class SvdBase(StrictModel):
    """Stock SVD (its UNet from model.source) with framer_ds' own conditioning conventions."""

    name: Literal["svd"] = Field(
        "svd",
        description="Which base: 'svd', stock Stable Video Diffusion (its key: mode), or 'framer', a Framer "
        "checkpoint (its keys: source, train_modules, controlnet_cond_scale, controlnet_step_range; mode "
        "is interpolation).",
    )
    mode: VideoMode = Field(
        "image_to_video",
        description="'interpolation': condition on the first AND last frame (a zero-initialised mask "
        "channel widens conv_in); 'image_to_video': on the first frame, as SVD.",
    )


class FramerBase(StrictModel):
    """A Framer checkpoint as the base: `unet/` + `controlnet/` from `source`, VAE and CLIP from the SVD
    directory (model.source), Framer's conditioning convention (mask token, mask on missing frames, CLIP
    of first and last frame). docs/video_lora.md."""

    name: Literal["framer"] = Field(description="'framer': fine-tune a Framer checkpoint.")
    mode: Literal["interpolation"] = Field(
        "interpolation", description="Framer interpolates between the first and last frame: always so."
    )
    source: FramerSource = Field(description="The Framer checkpoint: path or builtin.")
    train_modules: Literal["unet_lora", "controlnet", "both"] = Field(
        "unet_lora",
        description="'unet_lora': a LoRA on the UNet (ControlNet frozen); 'controlnet': the whole "
        "ControlNet (UNet frozen, no LoRA); 'both'.",
    )
    controlnet_cond_scale: float = Field(
        1.0, ge=0, description="Scale of the ControlNet residuals (Framer's controlnet_cond_scale)."
    )
    controlnet_step_range: StepRange = Field(
        (0.0, 1.0),
        description="Sampling only: the ControlNet runs on steps i whose fraction i/steps lies in [lo, hi) "
        "(Framer's controlnet_step_range); training sees it at every noise level.",
    )


class WanSource(Source):
    """Where the Wan components come from: one diffusers Wan image-to-video folder."""

    path: Path | None = Field(
        None,
        description="Local diffusers Wan image-to-video folder (Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers, "
        "Wan2.1-I2V-14B-480P-Diffusers layout: transformer/ vae/ text_encoder/ tokenizer/ image_encoder/ "
        "image_processor/ scheduler/; Wan2.2-I2V-A14B-Diffusers: transformer/ + transformer_2/, no image "
        "encoder).",
    )
    builtin: Literal["tiny_wan_flf2v", "tiny_wan_i2v", "tiny_wan22_i2v"] | None = Field(
        None,
        description="'tiny_wan_flf2v' (first + last frame), 'tiny_wan_i2v' (first frame) or "
        "'tiny_wan22_i2v' (Wan 2.2's two experts, first frame, no CLIP): a tiny random Wan base built in "
        "the cache (tests, demo).",
    )


WanExpert = Literal["high_noise", "low_noise"]


class WanBase(StrictModel):
    """A Wan 2.1 or 2.2 image-to-video base (diffusers' WanTransformer3DModel, AutoencoderKLWan, UMT5, and
    CLIP vision where the base has it) under the rectified-flow objective (diffusion/flow_matching.py).
    A Wan 2.2 base holds two experts; a run trains one of them (`expert`). docs/video_lora.md, "Wan"."""

    name: Literal["wan"] = Field(description="'wan': fine-tune a Wan 2.1 or 2.2 image-to-video base.")
    mode: VideoMode = Field(
        description="'interpolation': first AND last frame (FLF2V; diffusers' last_image), needs an FLF2V "
        "base; 'image_to_video': the first frame (I2V base)."
    )
    source: WanSource = Field(description="The diffusers Wan folder: path or builtin.")
    prompt: str | None = Field(
        None,
        description="One fixed prompt for every clip; null = each video's caption file: <video stem>.txt "
        "beside the video (UTF-8, surrounding whitespace stripped), refused by `data check`/`validate` "
        "when missing.",
    )
    shift: float | None = Field(
        None,
        gt=0,
        description="The flow-matching shift of the training sigmas; null = the folder's "
        "scheduler/scheduler_config.json (Wan: 3.0 at 480p, 5.0 at 720p).",
    )
    timestep_sampling: Literal["uniform", "logit_normal"] = Field(
        "uniform",
        description="'uniform': u ~ U(0,1) on the shifted table (Wan's own); 'logit_normal': u = "
        "sigmoid(N(logit_mean, logit_std)) (SD3).",
    )
    logit_mean: float = Field(0.0, description="logit_normal: the normal's mean.")
    logit_std: float = Field(1.0, gt=0, description="logit_normal: the normal's std.")
    loss_weighting: Literal["none", "sigma_sqrt", "cosmap"] = Field(
        "none", description="Per-sample loss weights (diffusers' compute_loss_weighting_for_sd3); Wan: none."
    )
    eval_sigmas: int = Field(
        5,
        ge=1,
        description="Fixed sigmas of the deterministic eval loss: the training table's quantiles (within "
        "the expert's range on a two-expert base).",
    )
    expert: WanExpert | None = Field(
        None,
        description="Two-expert (Wan 2.2) bases only, and required there: 'high_noise' trains transformer/ "
        "on timesteps >= boundary_ratio * 1000, 'low_noise' trains transformer_2/ on the rest (the "
        "pipeline's switch); the other expert is not loaded. Train both with two runs.",
    )
    boundary_ratio: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Two-expert bases only: where the experts hand over, as a fraction of the 1000 training "
        "timesteps; null = the folder's model_index.json boundary_ratio (0.9 for Wan2.2-I2V-A14B).",
    )


def _base_name(value: Any) -> str:
    """The tag of a `model.base` value; a mapping without `name` is svd, as an absent model.base is (so
    the override `model.base.mode=interpolation` alone means SVD interpolation)."""
    return value.get("name", "svd") if isinstance(value, dict) else getattr(value, "name", "svd")


# One member per base model, told apart by `name`.
VideoBase = Annotated[
    Annotated[SvdBase, Tag("svd")] | Annotated[FramerBase, Tag("framer")] | Annotated[WanBase, Tag("wan")],
    Discriminator(
        _base_name,
        custom_error_type="unknown_base",
        custom_error_message="base.name is one of 'svd', 'framer', 'wan' (each base with its own keys)",
    ),
]
