"""The `model:` and `data:` sections of a video_lora run and its `framer-ds sample` options, assembled
from what every base shares (shared/options.py) and each base family's own options (svd/, framer/,
wan/, ltx2/ `options.py`): one union member and one set of sample flags per family."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from framer_ds.config.schema import StrictModel
from framer_ds.tasks.video_lora.framer.options import FramerBase, FramerSampleFlags, TrackOptions
from framer_ds.tasks.video_lora.ltx2.options import Ltx2Base
from framer_ds.tasks.video_lora.shared.options import (
    InterpEvalOptions,
    SampleOptions,
    SharedSampleFlags,
    TextSampleFlags,
    VideoDataConfig,
)
from framer_ds.tasks.video_lora.svd.options import (
    EdmOptions,
    LoraOptions,
    SvdBase,
    SvdSampleFlags,
    SvdSource,
    TemporalContextOrder,
    default_order,
)
from framer_ds.tasks.video_lora.wan.options import WanBase, WanSampleFlags


def _base_name(value: Any) -> str:
    """The tag of a `model.base` value; a mapping without `name` is svd, as an absent model.base is (so
    the override `model.base.mode=interpolation` alone means SVD interpolation)."""
    return value.get("name", "svd") if isinstance(value, dict) else getattr(value, "name", "svd")


# One member per base model, told apart by `name`.
VideoBase = Annotated[
    Annotated[SvdBase, Tag("svd")]
    | Annotated[FramerBase, Tag("framer")]
    | Annotated[WanBase, Tag("wan")]
    | Annotated[Ltx2Base, Tag("ltx2")],
    Discriminator(
        _base_name,
        custom_error_type="unknown_base",
        custom_error_message="base.name is one of 'svd', 'framer', 'wan', 'ltx2' (each base with its own "
        "keys)",
    ),
]


# SVD/Framer keys that a DiT base (Wan, LTX-2) cannot honour, each with the reason a config setting it is
# refused; a base's `honoured_model_keys` names those it reads with the same meaning (LTX-2: fps).
DIT_REFUSED_KEYS = {
    "source": "the SVD directory; this base reads model.base.source",
    "edm": "EDM noise settings; this base trains under flow matching (its model.base keys)",
    "fps": "this base has no fps conditioning",
    "motion_bucket": "this base has no motion-bucket conditioning",
    "temporal_context_order": "a UNet temporal-attention setting; this base is a DiT",
    "dropout_image": "SVD's image-embedding dropout; this base trains without condition dropout",
    "dropout_latents": "SVD's conditioning-latent dropout; this base trains without condition dropout",
    "vae_tile_size": "SVD's VAE tiling; this base's VAE encodes whole frames here",
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
        "Required by the svd and framer bases; a wan or ltx2 base names its folder in base.source instead.",
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
    fps: float | None = Field(
        None,
        gt=0,
        description="The frame rate training conditions on (SVD/Framer: the fps added time id; LTX-2: the "
        "time scale of its positions, in seconds); null = each clip's effective fps (source fps / stride).",
    )
    motion_bucket: int | Literal["from_data"] = Field(
        127,
        description="SVD's motion conditioning (added time id; higher = more motion): one value for every "
        "clip, or 'from_data': each video's motion score (normal flow on downscaled frames, "
        "svd/motion.py) mapped to 0..255 by the training set's quantiles, so the model keeps the "
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
        """SVD and Framer read the SVD directory; a DiT base (Wan, LTX-2) has its own folder and none of
        SVD's knobs."""
        if isinstance(self.base, SvdBase | FramerBase):
            if self.source is None:
                raise ValueError(
                    "model.source: missing; the svd and framer bases need the SVD directory: set "
                    "model.source.path (a diffusers SVD folder) or model.source.builtin: tiny_svd"
                )
            return self
        honoured = getattr(type(self.base), "honoured_model_keys", frozenset())
        problems = [
            f"model.{key}: {why}; drop it for model.base.name {self.base.name}"
            for key, why in DIT_REFUSED_KEYS.items()
            if key not in honoured
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


class VideoLoraDataConfig(VideoDataConfig):
    tracks: TrackOptions | None = Field(
        None,
        description="Point trajectories -> `controlnet_cond` heatmaps per item (Framer's trajectory "
        "branch); null = none.",
    )


class VideoSampleCommandOptions(
    SvdSampleFlags, FramerSampleFlags, WanSampleFlags, TextSampleFlags, SharedSampleFlags
):
    """`framer-ds sample RUN/final --image first.png [--last-image last.png] --out video.mp4`; every
    conditioning value defaults to what training used (the adapter's metadata). Each base family's
    flags are its own (`SvdSampleFlags`, `FramerSampleFlags`, `WanSampleFlags`): an export refuses the
    flags of another family by name (`shared/exports.refuse_foreign_flags`)."""
