"""The `model:` and `data:` sections of a video_lora run."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from framer_ds.config.lora import LoraBase
from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.video_lora.bases import SvdBase, SvdSource, VideoBase
from framer_ds.tasks.video_lora.diffusion.edm import COND_NOISE_MEAN, COND_NOISE_STD, P_MEAN, P_STD
from framer_ds.tasks.video_lora.diffusion.temporal_context import TemporalContextOrder, default_order

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


# sampling.GuidanceSchedule's names, spelled here so that reading a config never imports the sampler
# (diffusers' SVD pipeline: seconds, and transformers' torchvision warning on every `validate`).
GuidanceScheduleName = Literal["linear", "middle_max"]


class SamplingSettings(StrictModel):
    """How a video is sampled from its first (and last) frame: the settings validation samples and the
    interpolation metrics share (`sampling.sample_video`; `sampling_kwargs` passes them on)."""

    num_inference_steps: int = Field(25, ge=1, description="Euler sampling steps per video.")
    min_guidance_scale: float = Field(
        1.0, ge=0, description="Classifier-free guidance at the first frame (ramps linearly to max)."
    )
    max_guidance_scale: float = Field(3.0, ge=0, description="Classifier-free guidance at the last frame.")
    guidance_schedule: GuidanceScheduleName = Field(
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
    framer_ds/tasks/video_lora/metrics/interp_metrics.py). Costs a full sampling run per held-out clip."""

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


# SVD/Framer keys that a Wan base cannot honour, each with the reason a config setting it is refused.
WAN_REFUSED_KEYS = {
    "source": "the SVD directory; a Wan base reads model.base.source",
    "edm": "EDM noise settings; Wan trains under flow matching (model.base.shift, timestep_sampling)",
    "fps": "Wan has no fps conditioning",
    "motion_bucket": "Wan has no motion-bucket conditioning",
    "temporal_context_order": "a UNet temporal-attention setting; Wan is a DiT",
    "dropout_image": "SVD's image-embedding dropout; the Wan family trains without condition dropout",
    "dropout_latents": "SVD's conditioning-latent dropout; the Wan family trains without condition dropout",
    "vae_tile_size": "SVD's VAE tiling; Wan's VAE encodes whole frames here",
}


class VideoLoraModelConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {
        "base": "base.name",  # first: the old scalar becomes the section the next keys move into
        "mode": "base.mode",
        "framer.path": "base.source.path",
        "framer.builtin": "base.source.builtin",
        "framer.train_modules": "base.train_modules",
        "framer.controlnet_cond_scale": "base.controlnet_cond_scale",
        "framer.controlnet_step_range": "base.controlnet_step_range",
        "pretrained_model_name_or_path": "source.path",
        "builtin": "source.builtin",
        "motion_bucket_id": "motion_bucket",  # the same 0..255 (motion_bucket also takes from_data)
    }

    source: SvdSource | None = Field(
        None,
        description="Where the SVD components come from: path (a local diffusers SVD directory) or builtin. "
        "Required by the svd and framer bases; a wan base names its folder in base.source instead.",
    )
    base: VideoBase = Field(
        default_factory=SvdBase,
        description="The model fine-tuned, chosen by base.name, with that base's own options: "
        "{name: svd, mode: image_to_video | interpolation} or {name: framer, source: ..., train_modules: "
        "...}. Framer interpolates.",
    )
    temporal_context_order: TemporalContextOrder | None = Field(
        None,
        description="How the UNet's temporal cross-attention pairs pixels with CLIP contexts in a batch: "
        "'framer' is Framer's layout (pixel row r reads the context of batch item r mod B; Framer's "
        "checkpoints were trained and are sampled that way, and at batch 2 under guidance the "
        "conditional and unconditional contexts mix), 'diffusers' is stock diffusers' (each pixel reads "
        "its own item's). null = the base's own: 'framer' for model.base.name framer, 'diffusers' for svd. "
        "Training and sampling both use it; the export records it (docs/video_lora.md, Framer).",
    )
    lora: LoraOptions = Field(
        default_factory=LoraOptions, description="Which UNet layers get LoRA, and its size."
    )
    edm: EdmOptions = Field(
        default_factory=EdmOptions, description="The EDM noise distributions of the objective."
    )
    fps: float | None = Field(None, gt=0, description="fps conditioning; null = each clip's effective fps.")
    motion_bucket: int | Literal["from_data"] = Field(
        127,
        description="SVD's motion conditioning (added time id; higher = more motion): one value for every "
        "clip, or 'from_data': each video's motion score (normal flow on downscaled frames, "
        "data/motion_score.py) mapped to 0..255 by the training set's quantiles, so the model keeps the "
        "motion control a fixed 127 erases.",
    )
    train_mask_token: bool = Field(
        False,
        description="Framer bases: train Framer's mask_token (the learned conditioning latent of every "
        "missing frame) full-rank beside the LoRA/ControlNet; saved in checkpoints and final/ "
        "(mask_token.safetensors) and written into the Framer and merged exports. false keeps the "
        "released token (Framer's own fine-tuning behaviour). Refused on an SVD base (it has no token).",
    )
    mask_token_lr: float | None = Field(
        None,
        gt=0,
        description="The mask_token's own learning rate (a second optimizer param group, following the "
        "same schedule); null = train.optimizer.learning_rate. Needs train_mask_token: true.",
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
    interp_eval: InterpEvalOptions = Field(
        default_factory=InterpEvalOptions,
        description="Held-out interpolation metrics (PSNR, SSIM, flicker, CLIP distance) at each evaluation.",
    )

    @field_validator("motion_bucket")
    @classmethod
    def _bucket_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= 255:
            raise ValueError(f"a motion bucket is 0..255 (or from_data), got {value}")
        return value

    @model_validator(mode="after")
    def _source_for_the_base(self) -> VideoLoraModelConfig:
        """SVD and Framer read the SVD directory; Wan has its own folder and none of SVD's knobs."""
        if self.base.name != "wan":
            if self.source is None:
                raise ValueError(
                    "model.source: missing; the svd and framer bases need the SVD directory: set "
                    "model.source.path (a diffusers SVD folder) or model.source.builtin: tiny_svd"
                )
            return self
        problems = [
            f"model.{key}: {why}; drop it for model.base.name wan"
            for key, why in WAN_REFUSED_KEYS.items()
            # a value other than the default (a resolved config dumps every key, defaults included)
            if getattr(self, key) != type(self).model_fields[key].get_default(call_default_factory=True)
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _mask_token_needs_framer(self) -> VideoLoraModelConfig:
        """A flag that cannot act is refused, naming the fix (not silently ignored)."""
        if self.train_mask_token and self.base.name != "framer":
            raise ValueError(
                f"model.train_mask_token: model.base.name {self.base.name!r} has no mask_token (only "
                "Framer's UNet has one); set model.base.name: framer or train_mask_token: false"
            )
        if self.mask_token_lr is not None and not self.train_mask_token:
            raise ValueError(
                "model.mask_token_lr is set but model.train_mask_token is false, so nothing uses it; set "
                "model.train_mask_token: true or drop mask_token_lr"
            )
        return self

    @property
    def context_order(self) -> TemporalContextOrder:
        """The temporal context order this run trains and samples with (`temporal_context_order` or
        the base's own)."""
        return self.temporal_context_order or default_order(self.base.name)

    @property
    def fixed_motion_bucket(self) -> int:
        """The bucket one value stands for: the configured one, or with from_data 127, where the
        training set's median motion lands (samples while training, and the sampler's default)."""
        return 127 if self.motion_bucket == "from_data" else self.motion_bucket


class LatentCacheOptions(StrictModel):
    """Encode every clip once (VAE latents, conditioning latents, CLIP embedding) and train from disk,
    so the VAE and image encoder leave the GPU. Augmentation (start frame, stride, crop, flip) and the
    conditioning-noise draw are fixed per cached clip: raise `clips_per_video` for more variety."""

    enabled: bool = Field(False, description="Train from encoded clips cached on disk (built once at start).")
    dir: Path | None = Field(
        None, description="Where cached clips live (shared by every node); default <cache>/latent_cache."
    )
    clips_per_video: int = Field(1, ge=1, description="Random clips encoded per training video.")


class TrackOptions(StrictModel):
    """Point trajectories for Framer's ControlNet branch: each video is tracked once at its source frame
    rate (`framer-ds data tracks CONFIG`), and each training item gets `controlnet_cond`, Framer's
    Gaussian heatmaps of K of its tracks (data/track_heatmaps.py, docs/video_lora.md)."""

    dir: Path | None = Field(
        None, description="Where the per-video track files live; default <cache>/point_tracks."
    )
    tracker: Literal["analytic", "cotracker"] = Field(
        "analytic",
        description="'analytic': exact tracks of data.source.builtin synthetic_clips; 'cotracker': Meta's "
        "CoTracker (the cotracker package and a local cotracker_checkpoint).",
    )
    cotracker_checkpoint: Path | None = Field(
        None, description="Local CoTracker checkpoint file (tracker cotracker); nothing is downloaded."
    )
    grid_size: int = Field(
        10, ge=1, description="CoTracker tracks a grid_size x grid_size grid of points per window."
    )
    segment_frames: int = Field(
        96,
        ge=2,
        description="CoTracker tracks each video in windows of this many source frames, each overlapping "
        "the next by half, with a fresh grid at the window's first frame (so clips late in a long video "
        "still have points, and memory stays bounded); a clip may span at most segment_frames // 2 + 1 "
        "source frames.",
    )
    num_points: int = Field(
        5, ge=1, description="Most trajectories per clip (K); fewer when fewer are visible in frame 0."
    )
    min_points: int = Field(
        1, ge=1, description="Fewest trajectories per clip: K ~ U[min_points, num_points]."
    )
    dropout: float = Field(
        0.1, ge=0, le=1, description="P(K = 0): the all-zero heatmap, so the model also runs without points."
    )
    moving_bias: float = Field(
        1.0,
        ge=0,
        le=1,
        description="0: points drawn uniformly; 1: chance proportional to a point's mean motion per frame "
        "(static points only after every moving one).",
    )

    @model_validator(mode="after")
    def _counts(self) -> TrackOptions:
        if self.min_points > self.num_points:
            raise ValueError(f"data.tracks.min_points {self.min_points} > num_points {self.num_points}")
        return self


class VideoDataSource(Source):
    """Where the clips come from."""

    path: Path | None = Field(None, description="Directory of videos or image pairs (recursive).")
    builtin: Literal["synthetic_clips"] | None = Field(
        None, description="'synthetic_clips': small moving-shape mp4s generated in the cache."
    )


class VideoLoraDataConfig(StrictModel):
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
    height: int = Field(320, ge=64, description="Training height in pixels (a multiple of 64).")
    width: int = Field(512, ge=64, description="Training width in pixels (a multiple of 64).")
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
    tracks: TrackOptions | None = Field(
        None,
        description="Point trajectories -> `controlnet_cond` heatmaps per item (Framer's trajectory "
        "branch); null = none.",
    )

    @model_validator(mode="after")
    def _checks(self) -> VideoLoraDataConfig:
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
