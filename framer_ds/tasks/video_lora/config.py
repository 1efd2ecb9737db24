"""The `model:` and `data:` sections of a video_lora run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from framer_ds.config.lora import LoraBase
from framer_ds.config.schema import StrictModel
from framer_ds.diffusion.edm import COND_NOISE_MEAN, COND_NOISE_STD, P_MEAN, P_STD

ATTENTION_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# The spatial blocks' `ff` and the temporal blocks' `ff_in` and `ff` (peft matches name suffixes).
FEED_FORWARD_TARGETS = ["ff.net.0.proj", "ff.net.2", "ff_in.net.0.proj", "ff_in.net.2"]
PROJECTION_TARGETS = ["proj_in", "proj_out"]


class LoraOptions(LoraBase):
    target_modules: list[str] = Field(
        default_factory=lambda: list(ATTENTION_TARGETS),
        description="Module name suffixes (attention by default).",
    )
    include_feed_forward: bool = Field(False, description="Also adapt the transformer feed-forward layers.")
    include_projections: bool = Field(False, description="Also adapt proj_in / proj_out.")

    def targets(self) -> list[str]:
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


class SampleOptions(StrictModel):
    """Videos generated from held-out clips' first (and last) frames while training, to watch what
    the loss cannot show. Written to output_dir/samples/step_N/ and logged to W&B as videos."""

    every: int = Field(0, ge=0, description="Sample every N optimizer steps (and at the end); 0 = never.")
    count: int = Field(2, ge=1, description="Videos per round: the first `count` held-out clips.")
    num_inference_steps: int = Field(25, ge=1, description="Euler sampling steps per video.")
    min_guidance_scale: float = Field(
        1.0, ge=0, description="Classifier-free guidance at the first frame (ramps linearly to max)."
    )
    max_guidance_scale: float = Field(3.0, ge=0, description="Classifier-free guidance at the last frame.")
    noise_aug_strength: float = Field(0.02, ge=0, description="Conditioning-frame noise (SVD default).")
    seed: int = Field(0, description="Sample i uses seed + i: the same noise every round.")
    decode_chunk_size: int = Field(8, ge=1, description="Frames per VAE decode call (memory).")
    with_reference: bool = Field(
        True, description="Write the real clip beside the sample (reference | sample) in each video."
    )


class VideoLoraModelConfig(StrictModel):
    pretrained_model_name_or_path: Path | None = Field(
        None, description="Local diffusers SVD directory (stable-video-diffusion-img2vid(-xt) layout)."
    )
    builtin: Literal["tiny_svd"] | None = Field(
        None, description="'tiny_svd': tiny random SVD components created in the cache (demo, tests)."
    )
    mode: Literal["image_to_video", "interpolation"] = Field(
        "image_to_video",
        description="'interpolation': condition on the first AND last frame (a zero-initialised mask "
        "channel widens conv_in); 'image_to_video': on the first frame, as SVD.",
    )
    lora: LoraOptions = Field(
        default_factory=LoraOptions, description="Which UNet layers get LoRA, and its size."
    )
    edm: EdmOptions = Field(
        default_factory=EdmOptions, description="The EDM noise distributions of the objective."
    )
    fps: float | None = Field(None, gt=0, description="fps conditioning; null = each clip's effective fps.")
    motion_bucket_id: int = Field(
        127, ge=0, le=255, description="SVD's motion conditioning (added time id); higher = more motion."
    )
    dropout_image: float = Field(0.1, ge=0, le=1, description="P(zero image embedding), for CFG.")
    dropout_latents: float = Field(0.1, ge=0, le=1, description="P(zero conditioning latents), for CFG.")
    vae_chunk_size: int = Field(
        8, ge=1, description="Frames per VAE encode call (memory); 1 = one frame at a time (slicing)."
    )
    vae_tile_size: int | None = Field(
        None,
        ge=64,
        multiple_of=64,  # tiles overlap by a quarter: other sizes misalign the blended latent grid
        description="Encode frames larger than this in overlapping, blended tiles (memory; the latents "
        "change slightly). null = whole frames.",
    )
    samples: SampleOptions = Field(
        default_factory=SampleOptions, description="Validation videos generated while training."
    )

    @model_validator(mode="after")
    def _one_source(self) -> VideoLoraModelConfig:
        if (self.pretrained_model_name_or_path is None) == (self.builtin is None):
            raise ValueError("set exactly one of model.pretrained_model_name_or_path or model.builtin")
        return self


class LatentCacheOptions(StrictModel):
    """Encode every clip once (VAE latents, conditioning latents, CLIP embedding) and train from disk,
    so the VAE and image encoder leave the GPU. Augmentation (start frame, stride, crop, flip) and the
    conditioning-noise draw are fixed per cached clip: raise `clips_per_video` for more variety."""

    enabled: bool = Field(False, description="Train from encoded clips cached on disk (built once at start).")
    dir: Path | None = Field(
        None, description="Where cached clips live (shared by every node); default <cache>/latent_cache."
    )
    clips_per_video: int = Field(1, ge=1, description="Random clips encoded per training video.")


class VideoLoraDataConfig(StrictModel):
    layout: Literal["videos", "image_pairs"] = Field(
        "videos",
        description="'image_pairs': {id}_start.ext + {id}_end.ext under data.root (interpolation only; "
        "the loss covers the two real frames).",
    )
    root: Path | None = Field(None, description="Directory of videos or image pairs (recursive).")
    builtin: Literal["synthetic_clips"] | None = Field(
        None, description="'synthetic_clips': small moving-shape mp4s generated in the cache."
    )
    manifest: Path | None = Field(None, description="CSV/JSONL with path and optional start/end frame, fps.")
    num_frames: int = Field(14, ge=2, description="Frames per training clip (SVD: 14, SVD-XT: 25).")
    stride: int | None = Field(1, ge=1, description="Frame step; null when stride_range is used.")
    stride_range: tuple[int, int] | None = Field(None, description="Random stride per clip, inclusive.")
    height: int = Field(320, ge=64, description="Training height in pixels (a multiple of 64).")
    width: int = Field(512, ge=64, description="Training width in pixels (a multiple of 64).")
    hflip: bool = Field(False, description="Train augmentation: flip a clip horizontally with p=0.5.")
    random_crop: bool = Field(
        False, description="Train augmentation: a random crop of the resized clip instead of the centre crop."
    )
    val_fraction: float = Field(0.1, ge=0, lt=1, description="Videos held out for the eval loss.")
    cache: LatentCacheOptions = Field(
        default_factory=LatentCacheOptions, description="Encode clips once and train from the cache."
    )

    @model_validator(mode="after")
    def _checks(self) -> VideoLoraDataConfig:
        if (self.root is None) == (self.builtin is None):
            raise ValueError("set exactly one of data.root or data.builtin")
        if (self.stride is None) == (self.stride_range is None):
            raise ValueError("set exactly one of data.stride or data.stride_range")
        return self

    @property
    def max_stride(self) -> int:
        return self.stride_range[1] if self.stride_range else self.stride
