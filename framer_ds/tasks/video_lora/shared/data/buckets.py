"""Aspect, resolution and length buckets (`data.buckets`): which shapes a run trains at and which clip
goes to which shape.

Why: cropping every clip to one `height x width x num_frames` throws away most of a portrait clip in
a landscape run and refuses every clip shorter than `num_frames`. With buckets each video trains at
the shape nearest its own aspect ratio and length, resized without distortion and cropped only by
the remainder; each micro-batch holds one shape (bucket_sampler.py), so nothing is padded.

A video's bucket is fixed (decided by its size and usable frames, not drawn), so the sampler, the
latent cache and the point tracks see the same shape for the same video on every rank and epoch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord

BUCKET_PATTERN = re.compile(r"^(\d+)x(\d+)x(\d+)$")
AUTO_FRAME_STEP = 4  # SVD's auto length buckets below data.num_frames: multiples of this (few shapes)
MAX_CROP_FRACTION = 0.4  # a clip whose nearest bucket would crop away more of its frame fits none


@dataclass(frozen=True, order=True)
class Bucket:
    """One training shape: height x width pixels, num_frames frames."""

    height: int
    width: int
    num_frames: int

    @property
    def name(self) -> str:
        return f"{self.height}x{self.width}x{self.num_frames}"

    @property
    def aspect(self) -> float:
        return self.width / self.height

    @property
    def volume(self) -> int:
        return self.height * self.width * self.num_frames

    @classmethod
    def parse(cls, text: str) -> Bucket:
        match = BUCKET_PATTERN.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a bucket: write HxWxF in pixels and frames, e.g. 64x96x8")
        return cls(*(int(g) for g in match.groups()))


def side_problem(value: int, multiple: int) -> str | None:
    """Why a frame height or width of `value` pixels does not fit a base whose VAE and denoiser
    downsample by `multiple` (the base family's `size_multiple()`), naming the nearest that does; None
    when it fits. The one statement of the rule: validate, the datasets and the buckets all ask it."""
    if value >= multiple and value % multiple == 0:
        return None
    nearest = max(multiple, round(value / multiple) * multiple)
    return (
        f"{value} is not a multiple of {multiple} (what this base's VAE and denoiser downsample by); "
        f"use {nearest}"
    )


def size_problems(height: int, width: int, multiple: int, where: str = "data") -> list[ConfigProblem]:
    """`side_problem` of both sides, as problems of `<where>.height` / `<where>.width`."""
    found = ((side, side_problem(value, multiple)) for side, value in (("height", height), ("width", width)))
    return [ConfigProblem(f"{where}.{side}", why) for side, why in found if why is not None]


def bucket_problems(
    texts: list[str],
    multiple: int,
    min_frames: int,
    frame_problem: Callable[[int], str | None] = lambda frames: None,
) -> list[str]:
    """Every problem of an explicit bucket list, one line each naming the fix: H and W multiples of
    `multiple`, at least `min_frames` frames, and a length the base takes (`frame_problem`: why not,
    from the base family, e.g. Wan's 1 + 4k)."""
    problems, seen = [], set()
    for text in texts:
        try:
            bucket = Bucket.parse(text)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        for side, value in (("height", bucket.height), ("width", bucket.width)):
            if (why := side_problem(value, multiple)) is not None:
                problems.append(f"{text}: {side} {why}")
        if bucket.num_frames < min_frames:
            problems.append(f"{text}: {bucket.num_frames} frames, this base needs at least {min_frames}")
        elif (why := frame_problem(bucket.num_frames)) is not None:
            problems.append(f"{text}: {why}")
        if bucket in seen:
            problems.append(f"{text} is listed twice")
        seen.add(bucket)
    return problems


def clip_frames(record: VideoRecord, stride: int) -> int:
    """Frames a clip of `record` can hold at `stride` (the smallest configured one)."""
    return (record.usable_frames - 1) // stride + 1 if record.usable_frames > 0 else 0


def auto_buckets(
    records: list[VideoRecord],
    area: int,
    max_frames: int,
    multiple: int,
    stride: int,
    min_frames: int,
    grid: tuple[int, int] = (0, AUTO_FRAME_STEP),
) -> list[Bucket]:
    """One bucket per distinct (shape, length) the clips call for: H x W with the clip's aspect ratio and
    an area near `area`, rounded to `multiple`; frames = the clip's length at `stride`, capped at
    `max_frames` and, below it, rounded down to the base family's `grid` (offset, step): offset + k * step
    (`VideoBaseFamily.frame_grid`: few shapes for SVD, the lengths its VAE takes for Wan)."""
    found = set()
    for record in records:
        frames = _auto_frames(clip_frames(record, stride), max_frames, min_frames, grid)
        if frames is None:
            continue
        aspect = record.width / record.height
        height = max(multiple, round(math.sqrt(area / aspect) / multiple) * multiple)
        width = max(multiple, round(math.sqrt(area * aspect) / multiple) * multiple)
        found.add(Bucket(height, width, frames))
    return sorted(found)


def _auto_frames(available: int, max_frames: int, min_frames: int, grid: tuple[int, int]) -> int | None:
    """Below the grid's first length at or above `min_frames` a clip keeps its own length (SVD's 2- and
    3-frame clips); a family whose every length must be on the grid starts it at `min_frames` (Wan: 5)."""
    if available >= max_frames:
        return max_frames
    offset, step = grid
    stepped = offset + (available - offset) // step * step
    frames = stepped if stepped >= min_frames else available
    return frames if frames >= min_frames else None


def crop_fraction(record: VideoRecord, bucket: Bucket) -> float:
    """Share of the frame a cover-resize to `bucket` crops away (0 for the same aspect ratio)."""
    ratio = bucket.aspect / (record.width / record.height)
    return 1.0 - min(ratio, 1.0 / ratio)


@dataclass
class BucketPlan:
    """Each training video's bucket, and the videos that fit none with the reason."""

    buckets: list[Bucket]
    assigned: dict[str, Bucket]  # video_id -> bucket
    unfit: dict[str, str]  # video_id -> why it fits no bucket

    def counts(self) -> Counter:
        return Counter(bucket.name for bucket in self.assigned.values())

    def largest(self) -> Bucket:
        return max(self.buckets, key=lambda b: (b.volume, b.name))

    def lines(self, shown: int | None = None) -> list[str]:
        """`64x96x8: 12 clips` per bucket, then each clip that fits none with why (the first `shown`)."""
        counts = self.counts()
        lines = [f"{bucket.name}: {counts.get(bucket.name, 0)} clips" for bucket in self.buckets]
        if self.unfit:
            lines.append(f"{len(self.unfit)} clips fit no bucket:")
            listed = sorted(self.unfit.items())
            lines += [f"  {vid}: {why}" for vid, why in listed[:shown]]
            if shown is not None and len(listed) > shown:
                lines.append(f"  ... and {len(listed) - shown} more (`framer-ds data check` lists all)")
        return lines


def assign_buckets(records: list[VideoRecord], buckets: list[Bucket], stride: int) -> BucketPlan:
    """Each video to the bucket nearest its aspect ratio among those its length fills (ties: the
    longest, then the larger area); a video too short for every bucket, or one that every bucket would
    crop by more than MAX_CROP_FRACTION, fits none."""
    assigned, unfit = {}, {}
    shortest = min(bucket.num_frames for bucket in buckets)
    for record in records:
        frames = clip_frames(record, stride)
        fitting = [b for b in buckets if b.num_frames <= frames]
        if not fitting:
            unfit[record.video_id] = (
                f"too short: {frames} frames at stride {stride}, the shortest bucket needs {shortest}"
            )
            continue
        aspect = math.log(record.width / record.height)
        best = min(fitting, key=lambda b: (abs(math.log(b.aspect) - aspect), -b.num_frames, -b.volume))
        if crop_fraction(record, best) > MAX_CROP_FRACTION:
            unfit[record.video_id] = (
                f"aspect {record.width}x{record.height}: the nearest bucket {best.name} would crop "
                f"{crop_fraction(record, best):.0%} of the frame (over {MAX_CROP_FRACTION:.0%}); add a "
                "bucket of that shape"
            )
            continue
        assigned[record.video_id] = best
    return BucketPlan(buckets, assigned, unfit)
