"""Framer's options: its checkpoint and `model.base` keys, `data.tracks` (point trajectories for the
ControlNet) and its `framer-ds sample` flags. Pydantic classes only; config.py assembles them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from framer_ds.config.schema import StrictModel
from framer_ds.config.source import Source
from framer_ds.tasks.video_lora.shared.options import FamilySampleFlags


def _step_range_in_unit_interval(value: tuple[float, float]) -> tuple[float, float]:
    if not 0 <= value[0] <= value[1] <= 1:
        raise ValueError(f"need [lo, hi] with 0 <= lo <= hi <= 1, got {list(value)}")
    return value


StepRange = Annotated[tuple[float, float], AfterValidator(_step_range_in_unit_interval)]
"""Fractions of the sampling steps where Framer's ControlNet runs (its `controlnet_step_range`)."""


class FramerSource(Source):
    """Where the Framer checkpoint (unet/ + controlnet/) comes from."""

    path: Path | None = Field(
        None, description="Local Framer directory with unet/ and controlnet/ (e.g. framer_512x320)."
    )
    builtin: Literal["tiny_framer"] | None = Field(
        None, description="'tiny_framer': a tiny random Framer checkpoint built in the cache (tests, demo)."
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


class TrackOptions(StrictModel):
    """Point trajectories for Framer's ControlNet branch: each video is tracked once at its source frame
    rate (`framer-ds data tracks CONFIG`), and each training item gets `controlnet_cond`, Framer's
    Gaussian heatmaps of K of its tracks (framer/tracks/heatmaps.py, docs/video_lora.md)."""

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


class FramerSampleFlags(FamilySampleFlags):
    """`framer-ds sample` flags of Framer exports: the trajectory ControlNet's tracks and settings."""

    refusal: ClassVar[str] = (
        "this export's base is {base}, which has no trajectory ControlNet: point tracks condition Framer "
        "exports only (model.base.name: framer); drop the flag"
    )

    tracks: Path | None = Field(
        None,
        description="Framer exports: a JSON file of point trajectories for the ControlNet, "
        '{"points": [[[x, y], ...per frame or keyframe...], ...per point...], "size": [W, H], '
        '"visible": [[true, ...], ...]} (size and visible optional) or Framer\'s demo drag list '
        "(docs/video_lora.md, Framer). Without it the ControlNet does not run.",
    )
    controlnet_scale: float | None = Field(
        None,
        ge=0,
        description="Framer exports: scale of the ControlNet residuals (Framer's controlnet_cond_scale); "
        "default: the export's model.base.controlnet_cond_scale.",
    )
    controlnet_step_range: StepRange | None = Field(
        None,
        description="Framer exports: the fractions of the sampling steps (LO HI, 0 <= LO <= HI <= 1) where "
        "the ControlNet runs (Framer's controlnet_step_range); default: the export's "
        "model.base.controlnet_step_range.",
    )
