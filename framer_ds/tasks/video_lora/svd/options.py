"""The SVD family's options: its source and `model.base`, the EDM noise settings and constants, the
temporal context order, the UNet's LoRA targets and its `framer-ds sample` flags. Pydantic classes and
constants only (reading a config imports no model code); config.py assembles them with the other
families'."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from framer_ds.config.lora import LoraBase
from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.video_lora.shared.options import FamilySampleFlags, GuidanceSchedule, VideoMode

# The values SVD fine-tuners use for the training-sigma lognormal (docs/architecture.md).
P_MEAN = 0.7
P_STD = 1.6
# Conditioning-frame noise augmentation: sigma_cond = exp(N(-3.0, 0.5)).
COND_NOISE_MEAN = -3.0
COND_NOISE_STD = 0.5

# How the UNet's temporal cross-attention pairs pixels with CLIP contexts (svd/temporal_context.py).
TemporalContextOrder = Literal["diffusers", "framer"]
TEMPORAL_CONTEXT_ORDERS: tuple[str, ...] = ("diffusers", "framer")


def default_order(base: str) -> TemporalContextOrder:
    """The order a base was trained with: Framer's for Framer checkpoints, diffusers' for stock SVD."""
    return "framer" if base == "framer" else "diffusers"


ATTENTION_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# The spatial blocks' `ff` and the temporal blocks' `ff_in` and `ff` (peft matches name suffixes).
FEED_FORWARD_TARGETS = ["ff.net.0.proj", "ff.net.2", "ff_in.net.0.proj", "ff_in.net.2"]
PROJECTION_TARGETS = ["proj_in", "proj_out"]
# The users' Framer recipe: attention, transformer projections, and the `ff` feed-forwards (spatial and
# temporal blocks; peft matches suffixes), the module names of Framer's own UNet class.
FRAMER_TARGETS = [*ATTENTION_TARGETS, *PROJECTION_TARGETS, "ff.net.0.proj", "ff.net.2"]


class LoraOptions(LoraBase):
    target_modules: list[str] = Field(
        default_factory=lambda: list(ATTENTION_TARGETS),
        description="Module name suffixes (attention by default).",
    )
    include_feed_forward: bool = Field(False, description="Also adapt the transformer feed-forward layers.")
    include_projections: bool = Field(False, description="Also adapt proj_in / proj_out.")
    preset: Literal["framer"] | None = Field(
        None,
        description="'framer': the Framer recipe's targets (to_q, to_k, to_v, to_out.0, proj_in, "
        "proj_out, ff.net.0.proj, ff.net.2) instead of target_modules and the include_* switches.",
    )

    def targets(self) -> list[str]:
        if self.preset == "framer":
            return list(FRAMER_TARGETS)
        found = list(self.target_modules)
        found += FEED_FORWARD_TARGETS if self.include_feed_forward else []
        found += PROJECTION_TARGETS if self.include_projections else []
        return found


class EdmOptions(StrictModel):
    """SVD's training distribution (docs/architecture.md, "The SVD objective"); fine-tuners use
    P_mean 0.7, P_std 1.6."""

    p_mean: float = Field(P_MEAN, description="Mean of log sigma for the training noise levels (lognormal).")
    p_std: float = Field(P_STD, gt=0, description="Std of log sigma for the training noise levels.")
    cond_noise_mean: float = Field(COND_NOISE_MEAN, description="log sigma of the conditioning-frame noise.")
    cond_noise_std: float = Field(
        COND_NOISE_STD, ge=0, description="Std of log sigma of the conditioning-frame noise (0 = fixed)."
    )
    eval_sigmas: int = Field(5, ge=1, description="Fixed sigma quantiles for the deterministic eval loss.")


class SvdSource(Source):
    """Where the SVD components come from (VAE, CLIP image encoder, and the UNet of base svd)."""

    path: Path | None = Field(
        None, description="Local diffusers SVD directory (stable-video-diffusion-img2vid(-xt) layout)."
    )
    builtin: Literal["tiny_svd"] | None = Field(
        None, description="'tiny_svd': tiny random SVD components created in the cache (demo, tests)."
    )


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


class SvdSampleFlags(FamilySampleFlags):
    """`framer-ds sample` flags of the SVD family's sampler (SVD and Framer exports)."""

    refusal: ClassVar[str] = "an SVD/Framer conditioning flag; this export's base is {base}: drop {flag}"

    motion_bucket: int | Literal["auto"] | None = Field(
        None,
        description="SVD's motion conditioning, 0..255, or 'auto': estimated from the first and last "
        "frames with the motion score training used (a run trained with model.motion_bucket: from_data, "
        "whose export records the score quantiles). Default: auto for such a run, else the trained value.",
        json_schema_extra={"old_flags": ["--motion-bucket-id"]},
    )
    noise_aug: float = Field(
        0.02, ge=0, description="Noise added to the conditioning frames (SVD's noise_aug_strength)."
    )
    min_guidance: float = Field(
        1.0, ge=0, description="Classifier-free guidance at the first frame (both ends with middle_max)."
    )
    max_guidance: float = Field(
        3.0, ge=0, description="Classifier-free guidance at the last frame (the middle with middle_max)."
    )
    decode_chunk_size: int = Field(8, ge=1, description="Frames per VAE decode call (memory).")
    guidance_schedule: GuidanceSchedule = Field(
        "linear",
        description="Guidance over the frames: 'linear' ramps min -> max from first to last frame (SVD); "
        "'middle_max' is Framer's middle_max_guidance: lowest at both ends, highest in the middle.",
    )

    @field_validator("motion_bucket")
    @classmethod
    def _bucket_range(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 0 <= value <= 255:
            raise ValueError(f"a motion bucket is 0..255 (or auto), got {value}")
        return value
