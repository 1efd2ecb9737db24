"""A motion score per indexed video, and SVD motion buckets (0..255) from the data set's quantiles.

SVD conditions on a motion bucket id; fine-tuning every clip at a fixed 127 teaches the model that all
motion is "127" and it loses the control (and its motion). `model.motion_bucket: from_data` gives each
clip a bucket from how much it actually moves, ranked within the training set.

The estimator (no OpenCV): frames are converted to grayscale, downscaled to `SCORE_WIDTH` pixels wide
(area average) and box-blurred 3x3; for each pair of consecutive frames, brightness constancy
`I_x u + I_y v + I_t = 0` gives the normal-flow magnitude `|I_t| / |grad I|` per pixel; its average
weighted by `|grad I|^2` (the least-squares weight, which ignores flat regions where the flow is
undefined) is `sum |grad I| |I_t| / sum |grad I|^2`, in pixels per frame at that width. The score is
the mean over the frame pairs. Normal flow underestimates motion along edges (the aperture problem)
and saturates for motion of many pixels per frame, but it is monotonic in motion, which is all a
quantile mapping needs.

Clips: a video's score divided by the stride it was scored at is its motion per source frame; a clip
at stride k scores that times k (constant speed within the clip; the normal flow's saturation for large
steps is ignored).

Buckets: the training clips' scores (each training video at each stride it can be drawn at), sorted,
define the map score -> round(255 * q) where q is the score's interpolated rank in [0, 1] (the lowest
training score -> 0, the median -> ~127, the highest -> 255); held-out and new clips go through the
same map, clamped. The map is a pure function of the scores, so every rank computes the same buckets.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.data.clip_reader import read_clip
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord
from framer_ds.tasks.video_lora.shared.data.wrapped_dataset import ForwardsToWrapped

SCORE_WIDTH = 64
MAX_PAIRS = 16
_EPS = 1e-8


def _prepare(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 [T,H,W,3] RGB (or float [T,H,W,3] in [0,1]) -> float [T,1,h,SCORE_WIDTH] grayscale."""
    x = torch.as_tensor(np.asarray(frames)).float()
    if x.max() > 1.0:
        x = x / 255.0
    gray = (x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114)[:, None]  # [T,1,H,W]
    h, w = gray.shape[-2:]
    size = (max(8, round(h * SCORE_WIDTH / w)), SCORE_WIDTH)
    small = F.interpolate(gray, size=size, mode="area") if (h, w) != size else gray
    return F.avg_pool2d(F.pad(small, (1, 1, 1, 1), mode="replicate"), 3, stride=1)


def motion_score(frames: np.ndarray | torch.Tensor) -> float:
    """Mean gradient-weighted normal-flow magnitude (pixels per frame at SCORE_WIDTH wide) of a clip
    [T,H,W,3]; 0 for a still clip."""
    x = _prepare(frames)
    if x.shape[0] < 2:
        raise ValueError("a motion score needs at least 2 frames")
    mean = (x[1:] + x[:-1]) / 2
    grad_x = (mean[..., :, 2:] - mean[..., :, :-2])[..., 1:-1, :] / 2
    grad_y = (mean[..., 2:, :] - mean[..., :-2, :])[..., :, 1:-1] / 2
    temporal = (x[1:] - x[:-1])[..., 1:-1, 1:-1]
    grad = torch.sqrt(grad_x**2 + grad_y**2)
    per_pair = (grad * temporal.abs()).flatten(1).sum(1) / ((grad**2).flatten(1).sum(1) + _EPS)
    return float(per_pair.mean())


def score_frame_indices(usable_frames: int, stride: int, max_pairs: int = MAX_PAIRS) -> tuple[int, int]:
    """(frames, stride) to read from a video of `usable_frames`: up to max_pairs + 1 frames at the
    training stride, fewer (at stride 1 if need be) for a short video."""
    stride = max(1, min(stride, (usable_frames - 1) or 1))
    return max(2, min(max_pairs + 1, (usable_frames - 1) // stride + 1)), stride


@dataclass(frozen=True)
class MotionBuckets:
    """score -> SVD motion bucket id by the training set's score quantiles."""

    sorted_scores: tuple[float, ...]

    @classmethod
    def from_scores(cls, scores: Sequence[float]) -> MotionBuckets:
        if not scores:
            raise ValueError(
                "motion buckets need the training clips' scores and there are none (no training video "
                "is long enough for a clip): check data.source.path and data.val_fraction, or set "
                "model.motion_bucket to a number such as 127"
            )
        return cls(tuple(sorted(float(s) for s in scores)))

    def quantile(self, score: float) -> float:
        """The score's rank among the training scores, linearly interpolated between neighbours and
        scaled to [0, 1] (np.interp over (sorted scores, 0..n-1)); 0.5 when all scores are equal."""
        s = np.asarray(self.sorted_scores)
        if s[0] == s[-1]:
            return 0.5
        return float(np.interp(score, s, np.arange(len(s))) / (len(s) - 1))

    def bucket(self, score: float) -> int:
        return round(255 * self.quantile(score))

    def summary(self) -> dict[str, float]:
        """What an export records: score quantiles, so a new clip can be bucketed the same way."""
        arr = np.asarray(self.sorted_scores)
        return {f"q{q:02d}": float(np.quantile(arr, q / 100)) for q in (0, 10, 25, 50, 75, 90, 100)}


def bucket_from_quantiles(score: float, quantiles: dict[str, float]) -> int:
    """The bucket of `score` by an export's recorded quantiles (`MotionBuckets.summary`: "q00".."q100"),
    for sampling a run trained with `from_data`: the score's percentile, linearly interpolated between
    the recorded ones (the training map interpolates between every training score; with the 7 recorded
    points the two agree at those points and differ a little between them), clamped to 0..255; the
    middle (128) when the training scores had no spread, as `MotionBuckets.quantile` gives."""
    points = sorted((int(name[1:]) / 100, float(value)) for name, value in quantiles.items())
    levels, values = [p[0] for p in points], [p[1] for p in points]
    if values[0] == values[-1]:
        return round(255 * 0.5)
    return round(255 * float(np.interp(score, values, levels)))


def end_frames_score(first: torch.Tensor, last: torch.Tensor, num_frames: int) -> float:
    """The motion score per clip frame of a clip known only by its first and last frame ([3,H,W] in
    [-1,1]): `motion_score` of the pair, which spans num_frames - 1 frame steps, over that count (the
    same constant-speed assumption that turns a video's score into a clip's at another stride)."""
    pair = ((torch.stack([first, last]).float().cpu().permute(0, 2, 3, 1) + 1) / 2).clamp(0, 1)
    return motion_score(pair) / max(1, num_frames - 1)


def _record_key(record: VideoRecord, stride: int) -> str:
    stat = Path(record.path).stat()
    return (
        f"{record.path}|{stat.st_size}|{stat.st_mtime_ns}|{record.first_frame}|{record.stop_frame}|{stride}"
    )


def _read_scores(path: Path) -> dict[str, float]:
    """The cached scores, or none when the file is absent or damaged (a cache: score again)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def score_records(records: Sequence[VideoRecord], stride: int, cache_dir: Path) -> dict[str, float]:
    """video_id -> motion score of each indexed video (up to MAX_PAIRS + 1 frames from its first usable
    frame at `stride`), cached in one JSON file per video set under `cache_dir`, keyed by path, size,
    mtime, frame range and stride: an edited video is scored again. Called once per node by the local
    main process (`Task.prepare_data`); the other ranks then read the cache."""
    keys = {r.video_id: _record_key(r, stride) for r in records}
    digest = hashlib.sha256("\n".join(sorted(keys.values())).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"motion_scores_{digest}.json"
    cached = _read_scores(path)
    scores, missing = {}, False
    for record in records:
        key = keys[record.video_id]
        if key not in cached:
            count, step = score_frame_indices(record.usable_frames, stride)
            frames = read_clip(record.path, record.first_frame, count, step, record.first_pts)
            cached[key], missing = motion_score(frames), True
        scores[record.video_id] = cached[key]
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, cached)
    return scores


def motion_rates(records: Sequence[VideoRecord], stride: int, cache_dir: Path) -> dict[str, float]:
    """video_id -> motion per source frame: each video's (cached) score over the stride it was scored
    at, which `score_frame_indices` lowers for a video too short for `stride`."""
    scores = score_records(records, stride, cache_dir)
    return {r.video_id: scores[r.video_id] / score_frame_indices(r.usable_frames, stride)[1] for r in records}


class WithMotionBucket(ForwardsToWrapped, torch.utils.data.Dataset):
    """A clip dataset whose items also carry `motion_bucket_id` (float, an added time id): the bucket of
    the clip's own motion, its video's motion per source frame (`rates`, looked up by the item's own
    `video_id`: the video actually read, also when a failed one was replaced) times the clip's stride
    (source fps / the item's fps). Why the stride: a clip at stride 3 moves three times as far per frame
    as the same video at stride 1, and SVD's bucket describes the clip it conditions."""

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        rates: dict[str, float],
        buckets: MotionBuckets,
        source_fps: dict[str, float],
    ):
        self.dataset, self.rates, self.buckets, self.source_fps = dataset, rates, buckets, source_fps

    def __len__(self) -> int:
        return len(self.dataset)

    def bucket_of(self, video_id: str, stride: int) -> int:
        return self.buckets.bucket(self.rates[video_id] * stride)

    def __getitem__(self, index: int) -> dict:
        item = self.dataset[index]
        video_id = item["video_id"]
        stride = max(1, round(self.source_fps[video_id] / float(item["fps"])))
        return {**item, "motion_bucket_id": float(self.bucket_of(video_id, stride))}

    def motion_fingerprint(self) -> dict:
        """What decides every item's bucket (part of the latent cache key)."""
        quantiles = hashlib.sha256(np.asarray(self.buckets.sorted_scores).tobytes()).hexdigest()[:16]
        return {"rates": sorted(self.rates.items()), "quantiles": quantiles}


AUTO = "auto"
"""`framer-ds sample --motion-bucket auto`: a run trained with `model.motion_bucket: from_data` samples, by
default, at the bucket the given first and last frames score with the measure training used (the pair's
normal-flow score per clip frame, mapped by the training set's recorded quantiles), instead of the fixed
127 that made every sample move like an average training clip."""


def motion_bucket_choice(
    flag: int | str | None,
    metadata: dict[str, Any],
    first: torch.Tensor,
    last: torch.Tensor | None,
    num_frames: int,
) -> dict[str, Any]:
    """{"motion_bucket": N, "motion_bucket_source": why, ["motion_score": s]}: an explicit number wins;
    `auto` (the default for a from_data export) estimates it from the input frames; otherwise the
    export's trained bucket."""
    from_data = "motion_score_quantiles" in metadata
    if isinstance(flag, int):
        return {"motion_bucket": flag, "motion_bucket_source": "--motion-bucket"}
    if flag == AUTO and not from_data:
        problem = ConfigProblem(
            "--motion-bucket",
            f"auto estimates the bucket with the motion score quantiles of a run trained with "
            f"model.motion_bucket: from_data; this export trained at the fixed bucket "
            f"{metadata.get('motion_bucket_id')}: pass a number 0..255 or leave the flag out",
        )
        raise ConfigError([problem], "sample")
    if not from_data:
        return {"motion_bucket": int(metadata["motion_bucket_id"]), "motion_bucket_source": "the export"}
    # image-to-video has no last frame: the first alone shows no motion, as a still clip would
    score = end_frames_score(first, last if last is not None else first, num_frames)
    return {
        "motion_bucket": bucket_from_quantiles(score, metadata["motion_score_quantiles"]),
        "motion_bucket_source": "the input frames",
        "motion_score": score,
    }


def data_motion_rates(data: Any, records: Sequence[VideoRecord] | None = None) -> dict[str, float]:
    """Each video of a `VideoLoraData` (`records`, else its index), its motion per source frame scored
    at the smallest training stride; cached, so `prepare_data` (local main process first) computes
    them and the other ranks read them."""
    records = records if records is not None else data.index().records
    return motion_rates(records, data.sampler.strides[0], default_cache_dir() / "motion_scores")


def with_motion_buckets(built: Any, data: Any) -> MotionBuckets:
    """model.motion_bucket from_data: `built`'s datasets wrapped so each item carries its clip's bucket
    (its video's motion per source frame times the clip's stride, ranked among the training clips:
    every training video at every stride it can be drawn at); returns the buckets (the export records
    their quantiles) and adds the run summary's note."""
    from framer_ds.tasks.video_lora.shared.data.video_clips import drawable_strides

    records, train_records, sampler = built.records, built.train_records, data.sampler
    rates = data_motion_rates(data, records)
    clip_scores = [rates[r.video_id] * k for r in train_records for k in drawable_strides(r, sampler)]
    buckets = MotionBuckets.from_scores(clip_scores)
    source_fps = {r.video_id: r.source_fps for r in records}
    built.train = WithMotionBucket(built.train, rates, buckets, source_fps)
    built.val = WithMotionBucket(built.val, rates, buckets, source_fps) if built.val is not None else None
    lo, hi = sampler.strides
    spread = sorted(buckets.bucket(rates[r.video_id] * lo) for r in train_records)
    built.notes["motion bucket"] = (
        f"from data: {len(rates)} videos scored, per clip by its stride ({lo}..{hi}); training videos "
        f"at stride {lo}: buckets {spread[0]}..{spread[-1]} (median {spread[len(spread) // 2]})"
    )
    return buckets
