"""The `model:` and `data:` sections of a drivable_vit run."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source


class AuxiliaryHeads(StrictModel):
    """The original design's self-supervised heads; a weight of 0 (the default) builds no head."""

    masked_patch_weight: float = Field(
        0.0, ge=0, description="Masked-patch reconstruction: loss weight (0 = off)."
    )
    mask_ratio: float = Field(
        0.4, gt=0, lt=1, description="Share of patch tokens replaced by a mask token while training."
    )
    next_frame_weight: float = Field(
        0.0,
        ge=0,
        description="Next-frame feature prediction: from frame t's temporal output, predict frame t+1's "
        "cross-view features (needs 2+ frames and a causal temporal stage). Loss weight; 0 = off.",
    )
    cross_view_weight: float = Field(
        0.0,
        ge=0,
        description="Cross-view consistency: each view's frame embedding is pulled toward the mean of the "
        "views of that frame (cosine). Loss weight; 0 = off.",
    )


class OverlayOptions(StrictModel):
    """Mask overlays of fixed validation samples written while training (samples/step_N/*.png)."""

    every: int | None = Field(
        None,
        ge=0,
        description="Optimizer steps between overlays (and one at the end); null = train.eval.every in "
        "steps (so at each eval; set it when evaluating by epochs or a fraction); 0 = never.",
    )
    count: int = Field(2, ge=1, description="Validation samples drawn, the first ones of the eval set.")


class DrivableModelConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {
        "img_size": "image_size",
        "overlays.every": "samples.every",  # `samples` as in the other tasks: what training writes there
        "overlays.count": "samples.count",
    }

    image_size: int = Field(
        256, ge=8, description="Input height = width in pixels; images are resized to it."
    )
    patch_size: int = Field(16, ge=2, description="Square patch side in pixels (divides image_size).")
    embed_dim: int = Field(768, ge=8, description="Token width of every stage (divisible by num_heads).")
    num_heads: int = Field(12, ge=1, description="Attention heads of every block.")
    mlp_ratio: float = Field(4.0, gt=0, description="MLP hidden width / embed_dim.")
    spatial_layers: int = Field(4, ge=1, description="Blocks of the per-view ViT (shared across views).")
    cross_view_layers: int = Field(
        4, ge=0, description="Blocks attending over all views' tokens of a frame (0 = no cross-view stage)."
    )
    temporal_layers: int = Field(
        4, ge=0, description="Blocks attending over frames, per token (0 = no temporal stage)."
    )
    temporal_causal: bool = Field(
        True, description="A frame attends only to itself and earlier frames (online use; next-frame head)."
    )
    ego_motion: bool = Field(
        False,
        description="Condition the temporal stage on ego motion ([T, 9] per sample, normalised with the "
        "training set's statistics); the manifest then needs data.ego_column.",
    )
    segment_frames: Literal["last", "all"] = Field(
        "last", description="Predict the masks of the last frame, or of every frame (masks for all T)."
    )
    decoder_channels: list[int] = Field(
        default_factory=lambda: [128, 64],
        min_length=1,
        description="Width of each decoder stage; each doubles the resolution, then the logits are "
        "interpolated to image_size (2 ** stages must not exceed patch_size).",
    )
    dice_weight: float = Field(0.0, ge=0, description="Soft Dice added to the BCE with this weight.")
    aux: AuxiliaryHeads = Field(default_factory=AuxiliaryHeads, description="Auxiliary heads (off).")
    samples: OverlayOptions = Field(
        default_factory=OverlayOptions,
        description="Mask overlays of validation samples written while training (samples/step_N/).",
    )

    @model_validator(mode="after")
    def _img_divisible_by_patch(self) -> DrivableModelConfig:
        if self.image_size % self.patch_size:
            fitting = self.image_size // self.patch_size * self.patch_size or self.patch_size
            raise ValueError(
                f"model.image_size {self.image_size} is not a multiple of model.patch_size "
                f"{self.patch_size}; set image_size to e.g. {fitting}"
            )
        return self

    @model_validator(mode="after")
    def _embed_divisible_by_heads(self) -> DrivableModelConfig:
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"model.embed_dim {self.embed_dim} is not divisible by model.num_heads {self.num_heads}; "
                "pick heads that divide it (e.g. 768 with 12 heads of 64)"
            )
        return self

    @model_validator(mode="after")
    def _decoder_fits_patch(self) -> DrivableModelConfig:
        stages = len(self.decoder_channels)
        if 2**stages > self.patch_size:
            raise ValueError(
                f"model.decoder_channels has {stages} stages (x{2**stages} upsampling) but a patch is "
                f"{self.patch_size} px; use at most "
                f"{self.patch_size.bit_length() - 1} stages"
            )
        return self

    @model_validator(mode="after")
    def _next_frame_needs_causal_time(self) -> DrivableModelConfig:
        if self.aux.next_frame_weight > 0 and (self.temporal_layers == 0 or not self.temporal_causal):
            raise ValueError(
                "model.aux.next_frame_weight > 0 predicts the next frame from the past: it needs "
                "model.temporal_layers >= 1 and model.temporal_causal true (a frame that sees the next one "
                "learns nothing)"
            )
        return self


class SyntheticRoadOptions(StrictModel):
    """`data.source.builtin: synthetic_roads`: the generated set (written once into the cache)."""

    train_samples: int = Field(96, ge=1, description="Training samples generated.")
    eval_samples: int = Field(20, ge=1, description="Validation samples generated.")
    image_size: int = Field(64, ge=16, description="Rendered image side in pixels (then resized).")
    seed: int = Field(0, description="Generator seed: the same set every time.")


class DrivableDataSource(Source):
    """Where the samples come from."""

    path: Path | None = Field(
        None,
        description="Manifest (.jsonl or .parquet) of training samples, or of all samples with a split "
        "column (then data.eval stays null).",
    )
    builtin: Literal["synthetic_roads"] | None = Field(
        None, description="'synthetic_roads': roads seen by three cameras over a few frames (generated)."
    )


class DrivableDataConfig(StrictModel):
    renamed_keys: ClassVar[dict[str, str]] = {"train": "source.path", "builtin": "source.builtin"}

    source: DrivableDataSource = Field(
        description="Where the samples come from: path (a manifest) or builtin (synthetic_roads)."
    )
    eval: Path | None = Field(None, description="Manifest of validation samples; null: use the split column.")
    synthetic: SyntheticRoadOptions = Field(
        default_factory=SyntheticRoadOptions, description="The generated set (data.source.builtin only)."
    )
    views: list[str] = Field(
        default_factory=lambda: ["left", "center", "right"],
        min_length=1,
        description="Camera names as the manifest keys them, in the model's order.",
    )
    frames: int = Field(3, ge=1, description="Frames per sample (T), oldest first.")
    split_column: str = Field("split", description="Column naming a row's split (one manifest).")
    train_split: str = Field("train", description="Value of the split column for training rows.")
    eval_split: str = Field("val", description="Value of the split column for validation rows.")
    id_column: str = Field("id", description="Column of the sample id (named in every error).")
    images_column: str = Field("images", description="Column of {view: [T image paths]}.")
    masks_column: str = Field("masks", description="Column of {view: [mask path(s)]}, the last ones.")
    ego_column: str = Field("ego_motion", description="Column of the [T, 9] ego motion.")
    mean: list[float] = Field(
        default_factory=lambda: [0.5, 0.5, 0.5], min_length=3, max_length=3, description="Pixel mean (RGB)."
    )
    std: list[float] = Field(
        default_factory=lambda: [0.5, 0.5, 0.5], min_length=3, max_length=3, description="Pixel std (RGB)."
    )
    verify_files: bool = Field(
        True,
        description="At start, check every file exists, opens and each mask matches its image's size "
        "(headers only). Large sets: false, and run `framer-ds data check` once instead.",
    )
    bad_samples: Literal["error", "skip"] = Field(
        "error", description="A bad sample: 'error' stops at start naming it; 'skip' drops and counts it."
    )

    @model_validator(mode="after")
    def _checks(self) -> DrivableDataConfig:
        generated = self.source.builtin is not None
        if generated and (self.eval is not None or self.views != ["left", "center", "right"]):
            raise ValueError(
                "data.source.builtin generates its own views and splits: drop data.eval and data.views"
            )
        if len(set(self.views)) != len(self.views):
            raise ValueError(f"data.views {self.views} names a view twice")
        if any(s <= 0 for s in self.std):
            raise ValueError("every data.std must be > 0")
        return self
