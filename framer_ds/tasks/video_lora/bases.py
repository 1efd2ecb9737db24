"""`model.base` of a video_lora run: the base model fine-tuned, one choice told apart by `name`, each
base with its own options, so that no config can hold an invalid combination (Framer in image-to-video
mode, Framer options on stock SVD). A new base (Wan: modes image_to_video and interpolation) is one more
member of `VideoBase`, with its own source and options, and readers branch on `base.name`."""

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


def _base_name(value: Any) -> str:
    """The tag of a `model.base` value; a mapping without `name` is svd, as an absent model.base is (so
    the override `model.base.mode=interpolation` alone means SVD interpolation)."""
    return value.get("name", "svd") if isinstance(value, dict) else getattr(value, "name", "svd")


# One member per base model, told apart by `name`; a new base (Wan) is one more member.
VideoBase = Annotated[
    Annotated[SvdBase, Tag("svd")] | Annotated[FramerBase, Tag("framer")],
    Discriminator(
        _base_name,
        custom_error_type="unknown_base",
        custom_error_message="base.name is one of 'svd', 'framer' (each base with its own keys)",
    ),
]
