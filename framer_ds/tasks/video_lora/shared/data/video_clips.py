"""Video clips for the video bases: where a clip starts, its stride, resize and crop, and the
datasets that read them (the decoding is clip_reader.py's).

Why a training dataset draws from each item's own generator (`seed=`, data/item_draws.py): a resumed
run must replay the same clips, strides, crops and flips, and draws from torch's global RNG did not
(accelerate's loader reads a batch ahead of the checkpoint). Without a seed the draws come from the
global RNG (ad-hoc use); the helpers take an optional `generator` for either.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError
from framer_ds.data.item_draws import DrawsPerItem, ItemDraws
from framer_ds.tasks.video_lora.shared.data.buckets import Bucket, size_problems
from framer_ds.tasks.video_lora.shared.data.clip_reader import VideoReadError, read_clip
from framer_ds.tasks.video_lora.shared.data.video_index import VideoIndex, VideoRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClipSampler:
    """Where a clip starts and its stride. `stride` is fixed, or `stride_range=(lo, hi)` draws one per
    clip; mode "random" (train) draws the start, "center"/"first" (eval) use no randomness."""

    num_frames: int
    stride: int | None = None
    stride_range: tuple[int, int] | None = None
    mode: Literal["random", "center", "first"] = "random"

    def __post_init__(self) -> None:
        if self.num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {self.num_frames}.")
        if self.stride is not None and self.stride_range is not None:
            raise ValueError("give stride or stride_range, not both; stride_range=(k, k) is a fixed stride.")
        lo, hi = self.strides
        if not 1 <= lo <= hi:
            raise ValueError(f"stride_range must be (min, max) with 1 <= min <= max, got {(lo, hi)}.")
        if self.mode not in ("random", "center", "first"):
            raise ValueError(f"mode must be 'random', 'center' or 'first', got {self.mode!r}.")

    @property
    def strides(self) -> tuple[int, int]:
        if self.stride_range is not None:
            return int(self.stride_range[0]), int(self.stride_range[1])
        stride = 1 if self.stride is None else self.stride
        return stride, stride

    @property
    def min_frames(self) -> int:
        """Frames a clip spans at the largest stride (a shorter video gets a smaller stride)."""
        return (self.num_frames - 1) * self.strides[1] + 1

    def allowed_strides(self, record: VideoRecord) -> tuple[int, int]:
        """(lo, hi) strides for this record: the configured ones, capped to the largest that fits it (a
        video too short for the largest stride still gives clips, at a smaller stride); hi 0 = none."""
        lo, hi = self.strides
        if self.num_frames > 1:
            hi = min(hi, (record.usable_frames - 1) // (self.num_frames - 1))
        if record.usable_frames < self.num_frames:
            hi = 0
        return min(lo, hi), hi

    def sample(self, record: VideoRecord, generator: torch.Generator | None = None) -> tuple[int, int]:
        """(start frame, stride); a stride too large for this record is capped to the largest that fits.
        Random draws come from `generator` (None: torch's global RNG)."""
        lo, hi = self.allowed_strides(record)
        avail = record.usable_frames
        if hi < 1:
            raise VideoReadError(f"{record.path} has {avail} usable frames, a clip needs {self.num_frames}")
        random = self.mode == "random"
        stride = (lo + hi) // 2
        if random and hi > lo:
            stride = int(torch.randint(lo, hi + 1, (1,), generator=generator))
        slack = avail - ((self.num_frames - 1) * stride + 1)
        if random:
            offset = int(torch.randint(0, slack + 1, (1,), generator=generator)) if slack else 0
        else:
            offset = slack // 2 if self.mode == "center" else 0
        return record.first_frame + offset, stride


def capped_records(records: list[VideoRecord], sampler: ClipSampler) -> list[VideoRecord]:
    """Records too short for the largest configured stride: their clips use a smaller one."""
    return [r for r in records if sampler.allowed_strides(r)[1] < sampler.strides[1]]


def drawable_strides(record: VideoRecord, sampler: ClipSampler) -> range:
    """Every stride a clip of `record` can be drawn at (empty for a video too short for any clip)."""
    lo, hi = sampler.allowed_strides(record)
    return range(max(lo, 1), hi + 1)


def conditioning_fps(records: list[VideoRecord], sampler: ClipSampler) -> list[float]:
    """Every fps value training conditions on (source fps / stride, each allowed stride of each record):
    what a sampler should default to when the config left `model.fps` to the data."""
    return [record.source_fps / stride for record in records for stride in drawable_strides(record, sampler)]


@dataclass(frozen=True)
class CropBox:
    """How a frame of src_h x src_w becomes height x width: scaled to new_h x new_w (covering the target,
    aspect kept), then the window at (top, left) kept. Point tracks follow frames through it."""

    src_h: int
    src_w: int
    new_h: int
    new_w: int
    top: int
    left: int
    height: int
    width: int


def crop_box(
    src_h: int,
    src_w: int,
    height: int,
    width: int,
    random_crop: bool,
    generator: torch.Generator | None = None,
) -> CropBox:
    """The scale that covers height x width, then the centre or a random crop (drawn from `generator`,
    None: torch's global RNG)."""
    scale = max(height / src_h, width / src_w)
    new_h, new_w = max(height, round(src_h * scale)), max(width, round(src_w * scale))
    if random_crop:
        top = int(torch.randint(0, new_h - height + 1, (1,), generator=generator))
        left = int(torch.randint(0, new_w - width + 1, (1,), generator=generator))
    else:
        top, left = (new_h - height) // 2, (new_w - width) // 2
    return CropBox(src_h, src_w, new_h, new_w, top, left, height, width)


def apply_crop_box(frames: np.ndarray | torch.Tensor, box: CropBox) -> torch.Tensor:
    """uint8 [T,H,W,3] -> float32 [T,3,height,width] in [0,1] (antialiased bilinear resize, crop)."""
    pixels = torch.as_tensor(frames).permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    if (box.new_h, box.new_w) != (box.src_h, box.src_w):
        pixels = F.interpolate(pixels, size=(box.new_h, box.new_w), mode="bilinear", antialias=True)
    pixels = pixels[:, :, box.top : box.top + box.height, box.left : box.left + box.width].contiguous()
    return pixels.to(torch.float32).div_(255.0)


def resize_and_crop(
    frames: np.ndarray | torch.Tensor, height: int, width: int, random_crop: bool
) -> torch.Tensor:
    """uint8 [T,H,W,3] -> float32 [T,3,height,width] in [0,1]: scale (antialiased bilinear) so the
    frame covers height x width, keeping the aspect ratio, then crop the rest (centre or random).

    Resize and crop run on uint8 (torch's antialiased uint8 kernel is ~10x faster than float32 on
    CPU) and only the cropped frames are converted to float: at 1024x576 -> 576x576 that is most of
    the per-clip cost after decoding."""
    src_h, src_w = frames.shape[1:3]
    return apply_crop_box(frames, crop_box(src_h, src_w, height, width, random_crop))


@dataclass(frozen=True)
class ClipPlacement:
    """Where a training clip came from: source frames start, start + stride, ..., the crop box, and
    whether it was flipped. Enough to carry per-video data (point tracks) onto the clip exactly; JSON
    so it survives default_collate and the latent cache's metadata."""

    start: int
    stride: int
    num_frames: int
    box: CropBox
    flipped: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClipPlacement:
        raw = json.loads(text)
        return cls(raw["start"], raw["stride"], raw["num_frames"], CropBox(**raw["box"]), raw["flipped"])


def _coprime_step(n: int) -> int:
    """A step near n/golden-ratio sharing no factor with n: retries visit every record once and land
    far from the failed one (bad files tend to sit together, e.g. one broken sub-directory)."""
    step = max(1, int(n * 0.618))
    while math.gcd(step, n) != 1:
        step += 1
    return step


class VideoClipDataset(DrawsPerItem, Dataset):
    """Index -> {"pixel_values": float32 [T,3,H,W] in [-1,1], "video_id": str, "fps": float}, where
    fps = source fps / stride (the rate SVD's fps conditioning should see); with `with_placement` also
    "placement": the clip's `ClipPlacement` as JSON (for point tracks). Augmentations (random
    start/stride/crop, flip) apply only when `train`; eval clips are centred and use no randomness.
    With `seed` each item draws them from its own generator, keyed by (seed, epoch, index): the same
    clip for the same place in training, whenever it is read (`item_draws.py`).

    A file that fails at read time (deleted or corrupted after indexing) is logged once, remembered,
    and replaced by another record (deterministic order, at most `max_retries` reads), so hour 3 of a
    run is not lost to one file. Each DataLoader worker keeps its own list; when more than
    `max_failed_fraction` of the records (at least one file is always tolerated) have failed in one
    process, InputDataError lists them: the data changed under the run and needs a look.

    With `buckets` (video_id -> `Bucket`, data.buckets) each video's clips take its bucket's height,
    width and frame count instead of the dataset's, items carry "bucket" (its name), and a failed file
    is replaced only by a video of the same bucket (a batch holds one shape).

    `size_multiple`: what the base family's VAE and denoiser downsample by (`VideoBaseFamily.
    size_multiple()`: 16 for Wan, 64 for SVD); height and width must be multiples of it. Each family
    states its own rule: this dataset once applied SVD's 64 to every base, refusing Wan's 480x832.
    """

    def __init__(
        self,
        index: VideoIndex,
        num_frames: int,
        height: int,
        width: int,
        stride: int | None = None,
        stride_range: tuple[int, int] | None = None,
        hflip: bool = False,
        random_crop: bool = False,
        train: bool = True,
        max_retries: int = 8,
        max_failed_fraction: float = 0.05,
        with_placement: bool = False,
        seed: int | None = None,
        buckets: dict[str, Bucket] | None = None,
        size_multiple: int = 1,
    ) -> None:
        problems = size_problems(height, width, size_multiple) if buckets is None else []
        if problems:
            raise ConfigError(problems, source="VideoClipDataset")
        self.draws = ItemDraws(seed) if seed is not None else None
        if not index.records:
            raise ValueError("the index has no usable videos; call require_usable(index, ...) first.")
        self.records = list(index.records)
        mode = "random" if train else "center"
        self.sampler = ClipSampler(num_frames, stride, stride_range, mode)
        self.height, self.width = height, width
        self.hflip, self.random_crop, self.train = hflip, random_crop, train
        self.max_retries, self.max_failed_fraction = max_retries, max_failed_fraction
        self.failed: dict[str, str] = {}  # path -> reason, for this process
        self.failures = 0  # failed reads, counting repeats
        self.with_placement = with_placement  # items carry "placement" (ClipPlacement JSON)
        self.buckets = buckets

    def shape_of(self, record: VideoRecord) -> tuple[int, int, int]:
        """(height, width, num_frames) of this record's clips: its bucket's, else the dataset's."""
        if self.buckets is None:
            return self.height, self.width, self.sampler.num_frames
        bucket = self.buckets[record.video_id]
        return bucket.height, bucket.width, bucket.num_frames

    def item_buckets(self) -> list[str]:
        """Each item's bucket name, in index order (the bucket sampler groups by it)."""
        return ["x".join(map(str, self.shape_of(record))) for record in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def _candidates(self, index: int) -> Iterator[VideoRecord]:
        n, step = len(self.records), _coprime_step(len(self.records))
        shape = self.shape_of(self.records[index % n])
        for k in range(n):
            record = self.records[(index + k * step) % n]
            if str(record.path) not in self.failed and self.shape_of(record) == shape:
                yield record

    def __getitem__(self, index: int) -> dict:
        generator = self.item_generator(index)  # one stream for the item, a replaced file included
        tries = 0
        for record in self._candidates(index):
            if tries > self.max_retries:
                break
            tries += 1
            try:
                return self._load(record, generator)
            except VideoReadError as exc:
                self._record_failure(record, str(exc))
        raise InputDataError(self._failure_message(f"no readable clip for item {index} after {tries} tries"))

    def _load(self, record: VideoRecord, generator: torch.Generator | None) -> dict:
        height, width, num_frames = self.shape_of(record)
        sampler = (
            self.sampler
            if num_frames == self.sampler.num_frames
            else replace(self.sampler, num_frames=num_frames)
        )
        start, stride = sampler.sample(record, generator)
        frames = read_clip(record.path, start, num_frames, stride, record.first_pts)
        random_crop = self.random_crop and self.train
        box = crop_box(*frames.shape[1:3], height, width, random_crop, generator)
        pixels = apply_crop_box(frames, box)
        flipped = bool(self.train and self.hflip and torch.rand(1, generator=generator).item() < 0.5)
        if flipped:
            pixels = pixels.flip(-1)
        item = {
            "pixel_values": pixels.mul_(2).sub_(1),
            "video_id": record.video_id,
            "fps": record.source_fps / stride,
        }
        if self.with_placement:
            item["placement"] = ClipPlacement(start, stride, num_frames, box, flipped).to_json()
        if self.buckets is not None:
            item["bucket"] = f"{height}x{width}x{num_frames}"
        return item

    def _record_failure(self, record: VideoRecord, reason: str) -> None:
        self.failures += 1
        self.failed[str(record.path)] = reason
        logger.warning("skipping %s for the rest of this run: %s", record.path, reason)
        allowed = max(1, int(self.max_failed_fraction * len(self.records)))
        if len(self.failed) > allowed:
            raise InputDataError(
                self._failure_message(
                    f"{len(self.failed)} of {len(self.records)} videos failed (limit {allowed})"
                )
            )

    def _failure_message(self, what: str) -> str:
        listing = "\n".join(f"  - {path}: {reason}" for path, reason in self.failed.items())
        return (
            f"{what}; the files changed after indexing:\n{listing}\nRestore or re-encode them, or delete "
            "them and rebuild the index (build_video_index lists every unreadable file) before resuming."
        )


class ImagePairDataset(DrawsPerItem, Dataset):
    """`scan_image_pairs` output -> {"pixel_values": float32 [2,3,H,W] (start, end) in [-1,1],
    "video_id": id, "num_frames": T}. Only the two real frames are returned: the interpolation task
    builds the T - 2 placeholder frames between them, so it alone decides what they hold. The flip
    draws as `VideoClipDataset`'s augmentation does (`seed`); the size follows the base family's
    `size_multiple`, as there."""

    def __init__(
        self,
        pairs: Sequence[tuple[str, Path, Path]],
        height: int,
        width: int,
        num_frames: int,
        hflip: bool = False,
        seed: int | None = None,
        size_multiple: int = 1,
    ) -> None:
        problems = size_problems(height, width, size_multiple)
        if num_frames < 2:
            problems.append(ConfigProblem("data.num_frames", f"{num_frames} < 2: a pair is two frames."))
        if problems:
            raise ConfigError(problems, source="ImagePairDataset")
        self.pairs, self.height, self.width = list(pairs), height, width
        self.num_frames, self.hflip = num_frames, hflip
        self.draws = ItemDraws(seed) if seed is not None else None

    def __len__(self) -> int:
        return len(self.pairs)

    def _load(self, path: Path) -> torch.Tensor:
        try:
            with Image.open(path) as image:
                array = np.array(image.convert("RGB"), dtype=np.uint8)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise InputDataError(
                f"cannot decode image {path} ({type(exc).__name__}: {exc}). Delete or replace the pair."
            ) from exc
        return resize_and_crop(array[None], self.height, self.width, random_crop=False)[0]

    def __getitem__(self, index: int) -> dict:
        pair_id, start, end = self.pairs[index]
        pixels = torch.stack([self._load(start), self._load(end)])
        if self.hflip and torch.rand(1, generator=self.item_generator(index)).item() < 0.5:
            pixels = pixels.flip(-1)
        return {"pixel_values": pixels.mul_(2).sub_(1), "video_id": pair_id, "num_frames": self.num_frames}
