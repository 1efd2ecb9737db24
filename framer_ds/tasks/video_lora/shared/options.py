"""The options every video base reads: how videos are sampled (validation samples, interp_eval), the
latent cache, the data source and the `data:` keys. The families' own options are in their `options.py`;
config.py assembles them into the task's `model:` and `data:` sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.base import SampleCommandOptions

VideoMode = Literal["image_to_video", "interpolation"]


# The guidance schedules of SVD's sampler (svd/sampling.guidance_scales), spelled once, here: the
# model.samples / model.interp_eval sections every base shares carry them (a Wan base refuses them), and
# reading a config never imports the sampler (diffusers' SVD pipeline: seconds, and transformers'
# torchvision warning on every `validate`).
GuidanceSchedule = Literal["linear", "middle_max"]


class SamplingSettings(StrictModel):
    """How a video is sampled from its first (and last) frame: the settings validation samples and the
    interpolation metrics share (`sampling.sample_video`; `sampling_kwargs` passes them on)."""

    num_inference_steps: int = Field(25, ge=1, description="Euler sampling steps per video.")
    min_guidance_scale: float = Field(
        1.0, ge=0, description="Classifier-free guidance at the first frame (ramps linearly to max)."
    )
    max_guidance_scale: float = Field(3.0, ge=0, description="Classifier-free guidance at the last frame.")
    guidance_schedule: GuidanceSchedule = Field(
        "linear",
        description="Guidance over the frames: 'linear' ramps min -> max (SVD); 'middle_max' is Framer's "
        "middle_max_guidance (lowest at both ends, highest in the middle).",
    )
    noise_aug_strength: float = Field(0.02, ge=0, description="Conditioning-frame noise (SVD default).")
    decode_chunk_size: int = Field(8, ge=1, description="Frames per VAE decode call (memory).")

    def sampling_kwargs(self) -> dict[str, object]:
        """These settings as `sampling.sample_video`'s keyword arguments."""
        return {name: getattr(self, name) for name in SamplingSettings.model_fields}


class SampleOptions(SamplingSettings):
    """Videos generated from held-out clips' first (and last) frames while training, to watch what
    the loss cannot show. Written to output_dir/samples/step_N/ and logged to W&B as videos."""

    every: int = Field(0, ge=0, description="Sample every N optimizer steps (and at the end); 0 = never.")
    count: int = Field(2, ge=1, description="Videos per round: the first `count` held-out clips.")
    seed: int = Field(0, description="Sample i uses seed + i: the same noise every round.")
    with_reference: bool = Field(
        True, description="Write the real clip beside the sample (reference | sample) in each video."
    )


class InterpEvalOptions(SamplingSettings):
    """Held-out interpolation metrics at every evaluation: each held-out clip is sampled from its first
    (and, for interpolation, last) frame with a seed fixed per clip, and compared with the real frames
    (`eval/psnr`, `eval/psnr_mid`, `eval/ssim`, `eval/psnr_ends`, `eval/flicker_ratio`,
    `eval/clip_distance`, and `eval/lpips` from local weight files; definitions in
    framer_ds/tasks/video_lora/shared/interp_metrics.py). Costs a full sampling run per held-out clip."""

    enabled: bool = Field(
        False, description="Sample every held-out clip at each evaluation and report metrics."
    )
    seed: int = Field(
        0, description="Added to each clip's own seed (a hash of its id): same noise every round."
    )
    clip_distance: bool = Field(
        True, description="Also eval/clip_distance: 1 - cosine of CLIP embeddings (the run's image encoder)."
    )
    lpips_weights: Path | None = Field(
        None,
        description="Also eval/lpips (v0.1) when set, with lpips_backbone: the lpips package's calibration "
        "file (its wheel's lpips/weights/v0.1/alex.pth or vgg.pth; the network follows from it). Nothing "
        "is downloaded; unset, eval/lpips is skipped and the run says why.",
    )
    lpips_backbone: Path | None = Field(
        None,
        description="The ImageNet backbone lpips_weights calibrates: torchvision's alexnet or vgg16 "
        "state dict (alexnet-owt-7be5be79.pth, vgg16-397923af.pth; .pth or .safetensors).",
    )

    @model_validator(mode="after")
    def _lpips_files_together(self) -> InterpEvalOptions:
        if (self.lpips_weights is None) != (self.lpips_backbone is None):
            raise ValueError(
                "model.interp_eval.lpips_weights and lpips_backbone go together: set both (the lpips "
                "calibration file and the torchvision backbone it calibrates) or neither"
            )
        return self


def samples_during_training(config: Any) -> bool:
    """Validation samples or interpolation metrics: the evaluations that decode videos."""
    return bool(config.model.samples.every) or config.model.interp_eval.enabled


class LatentCacheOptions(StrictModel):
    """Encode every clip once (VAE latents, conditioning latents, CLIP embedding) and train from disk,
    so the VAE and image encoder leave the GPU. Augmentation (start frame, stride, crop, flip) and the
    conditioning-noise draw are fixed per cached clip: raise `clips_per_video` for more variety."""

    enabled: bool = Field(False, description="Train from encoded clips cached on disk (built once at start).")
    dir: Path | None = Field(
        None, description="Where cached clips live (shared by every node); default <cache>/latent_cache."
    )
    clips_per_video: int = Field(1, ge=1, description="Random clips encoded per training video.")


class VideoDataSource(Source):
    """Where the clips come from."""

    path: Path | None = Field(None, description="Directory of videos or image pairs (recursive).")
    builtin: Literal["synthetic_clips"] | None = Field(
        None, description="'synthetic_clips': small moving-shape mp4s generated in the cache."
    )


class VideoDataConfig(StrictModel):
    """The `data:` keys every base reads (config.py's `VideoLoraDataConfig` adds Framer's `tracks`)."""

    renamed_keys: ClassVar[dict[str, str]] = {"root": "source.path", "builtin": "source.builtin"}
    one_of: ClassVar[tuple[tuple[str, ...], ...]] = (("stride", "stride_range"),)

    source: VideoDataSource = Field(
        description="Where the clips come from: path (a directory of videos or image pairs) or builtin."
    )
    layout: Literal["videos", "image_pairs"] = Field(
        "videos",
        description="'image_pairs': {id}_start.ext + {id}_end.ext under data.source.path (interpolation "
        "only; the loss covers the two real frames).",
    )
    manifest: Path | None = Field(None, description="CSV/JSONL with path and optional start/end frame, fps.")
    num_frames: int = Field(14, ge=2, description="Frames per training clip (SVD: 14, SVD-XT: 25).")
    stride: int | None = Field(
        1,
        ge=1,
        description="Frame step; null when stride_range is used (setting stride_range on the "
        "command line sets it null).",
    )
    stride_range: tuple[int, int] | None = Field(
        None, description="Random stride per clip, inclusive; exclusive with stride."
    )
    height: int = Field(
        320,
        ge=64,
        description="Training height in pixels, a multiple of the base family's size rule (64 for SVD and "
        "Framer, 16 for Wan: VAE x patch); validate names the nearest that fits.",
    )
    width: int = Field(
        512,
        ge=64,
        description="Training width in pixels, a multiple of the base family's size rule (64 for SVD and "
        "Framer, 16 for Wan: VAE x patch); validate names the nearest that fits.",
    )
    buckets: Literal["auto"] | list[str] | None = Field(
        None,
        description="Aspect/resolution/length buckets: null = one shape (height x width x num_frames, "
        "cropped); 'auto' = derived from the clips (their aspect ratios and lengths, area near height x "
        "width, at most num_frames); or a list of 'HxWxF' shapes (H, W multiples of what the base's VAE "
        "and denoiser downsample by: 64 SVD, 16 Wan; F for Wan 1 + a multiple of 4). Each clip trains at "
        "its nearest bucket, each micro-batch holds one "
        "bucket; evaluation stays at height x width x num_frames (docs/video_lora.md, Buckets).",
    )
    hflip: bool = Field(False, description="Train augmentation: flip a clip horizontally with p=0.5.")
    random_crop: bool = Field(
        False, description="Train augmentation: a random crop of the resized clip instead of the centre crop."
    )
    val_fraction: float = Field(0.1, ge=0, lt=1, description="Videos held out for the eval loss.")
    max_rejected_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Training (and `data check`) refuses to start when more than this fraction of the video "
        "files is unusable (corrupt, empty, too short); the rejected files are named either way.",
    )
    cache: LatentCacheOptions = Field(
        default_factory=LatentCacheOptions, description="Encode clips once and train from the cache."
    )

    @model_validator(mode="after")
    def _checks(self) -> VideoDataConfig:
        if (self.stride is None) == (self.stride_range is None):
            raise ValueError("set exactly one of data.stride or data.stride_range")
        if isinstance(self.buckets, list) and not self.buckets:
            raise ValueError("data.buckets is an empty list: list HxWxF shapes, or use auto or null")
        return self

    @property
    def min_stride(self) -> int:
        return self.stride_range[0] if self.stride_range else self.stride

    @property
    def max_stride(self) -> int:
        return self.stride_range[1] if self.stride_range else self.stride


class SharedSampleFlags(SampleCommandOptions):
    """The `framer-ds sample` flags every base family takes (its own come from its `options.py`)."""

    image: Path = Field(description="The first frame.")
    last_image: Path | None = Field(None, description="The last frame: required by interpolation adapters.")
    out: Path = Field(description="The .mp4 to write.")
    resize: Literal["crop", "stretch", "pad"] = Field(
        "crop",
        description="How a frame of another shape becomes the trained size: 'crop' scales to cover and "
        "centre-crops (as the training loader does), 'stretch' ignores the aspect ratio, 'pad' fits "
        "inside and pads with black.",
    )
    steps: int = Field(
        25,
        ge=1,
        description="Euler sampling steps.",
        json_schema_extra={"old_flags": ["--num-inference-steps"]},
    )
    seed: int = Field(0, description="Seeds the sampling noise.")
    fps: float | None = Field(
        None, gt=0, description="fps conditioning and output rate; default: the trained fps."
    )
    num_frames: int | None = Field(None, ge=2, description="Frames to generate; default: the trained count.")
    height: int | None = Field(
        None,
        ge=1,
        description="Frame height: a shape the export trained at (data.buckets); default: trained.",
    )
    width: int | None = Field(
        None, ge=1, description="Frame width: a shape the export trained at (data.buckets); default: trained."
    )
    frames: bool = Field(
        True,
        description="Also write each frame as a PNG in <out stem>_frames/ (lossless, for frame-by-frame "
        "comparison); --no-frames skips them (they take many times the mp4's space at large sizes).",
    )


class FamilySampleFlags(StrictModel):
    """One base family's own `framer-ds sample` flags (`SvdSampleFlags`, `FramerSampleFlags`,
    `WanSampleFlags`); `refusal`: the line an export of another family answers one of them with
    ({base}: the export's base, {flag}: the flag)."""

    refusal: ClassVar[str] = "this export's base is {base}: drop {flag}"


class TextSampleFlags(FamilySampleFlags):
    """The `framer-ds sample` flags of every text-conditioned base (Wan, LTX-2), declared once so
    `--prompt` is one flag with one meaning: LTX-2's exports take these and no others, Wan's add their own
    (`WanSampleFlags`)."""

    refusal: ClassVar[str] = (
        "a flag of the text-conditioned bases (Wan, LTX-2); this export's base is {base}: drop {flag}"
    )

    prompt: str | None = Field(None, description="Wan and LTX-2 exports: the text prompt (required there).")
    negative_prompt: str | None = Field(
        None, description="Wan and LTX-2 exports: the negative prompt; default: the diffusers pipeline's."
    )
    guidance_scale: float | None = Field(
        None,
        ge=0,
        description="Wan and LTX-2 exports: classifier-free guidance; default: the diffusers pipeline's.",
    )
    save_frames: Path | None = Field(
        None,
        description="Wan and LTX-2 exports: also save the float frames in [0, 1] the mp4 encodes, as a .npy "
        "of [frames, height, width, 3].",
    )
