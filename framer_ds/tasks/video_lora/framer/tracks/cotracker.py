"""Meta's CoTracker as a `point_tracks.Tracker`: overlapping windows of a video, each with a fresh grid.

Why windows: CoTracker's offline model takes a whole clip at once and was trained on 60-frame windows;
a grid queried at frame 0 of a long video has left the frame or been occluded by the middle, and a
video decoded whole at full resolution does not fit in memory (a minute of 1080p is ~45 GB as float).
Each window of `segment_frames` source frames (half of it overlapping the next) is decoded in short
chunks straight to the model's resolution (`CoTrackerPredictor.interp_shape`, bilinear with
`align_corners=True`, which is what the predictor itself would do to the full frames), tracked with a
grid at its first frame, and its tracks are scaled back to source pixels by the predictor's own
`(W - 1) / (w - 1)` rule.

Nothing is downloaded: the `cotracker` package (not on PyPI) and a local checkpoint are checked up
front by `cotracker_problems`, which names both fixes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import (
    TRACKS_FORMAT_VERSION,
    Tracks,
    VideoTracks,
    window_starts,
)
from framer_ds.tasks.video_lora.shared.data.clip_reader import read_clip
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord

DECODE_CHUNK_FRAMES = 16  # frames decoded at source resolution at a time


@dataclass(frozen=True)
class CoTrackerTracker:
    """CoTracker's offline predictor on a `grid_size` x `grid_size` grid per window of `segment_frames`."""

    checkpoint: Path
    grid_size: int = 10
    segment_frames: int = 96

    def fingerprint(self) -> str:
        stat = Path(self.checkpoint).stat()
        settings = f"{Path(self.checkpoint).name}|{stat.st_size}|{self.grid_size}|{self.segment_frames}"
        digest = hashlib.sha256(f"{settings}|v{TRACKS_FORMAT_VERSION}".encode())
        return f"cotracker-{digest.hexdigest()[:12]}"

    def track(self, record: VideoRecord) -> VideoTracks:
        from cotracker.predictor import CoTrackerPredictor

        device = "cpu"
        if torch.cuda.is_available():  # one GPU per launched process; srun may show each only its own
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"
        model = _cotracker_model(CoTrackerPredictor, str(self.checkpoint), device)
        model_h, model_w = (int(v) for v in model.interp_shape)
        segments = []
        for first in window_starts(record.num_frames, self.segment_frames):
            count = min(self.segment_frames, record.num_frames - first)
            video, (height, width) = frames_at_model_size(record, first, count, (model_h, model_w), device)
            with torch.no_grad():
                xy, visible = model(video, grid_size=self.grid_size)
            scale = np.array([(width - 1) / (model_w - 1), (height - 1) / (model_h - 1)], np.float32)
            xy = xy[0].float().cpu().numpy() * scale
            visible = visible[0].float().cpu().numpy() > 0.5  # bool today; a probability would work too
            segments.append(Tracks(xy, visible, height, width, first))
        return VideoTracks(segments)


def frames_at_model_size(
    record: VideoRecord, first: int, count: int, size: tuple[int, int], device: str
) -> tuple[torch.Tensor, tuple[int, int]]:
    """(float [1, count, 3, h, w] 0..255 at `size`, (source height, width)): frames first.. of the video,
    resized chunk by chunk so only DECODE_CHUNK_FRAMES frames are ever held at source resolution."""
    chunks, source = [], (record.height, record.width)
    for start in range(first, first + count, DECODE_CHUNK_FRAMES):
        frames = read_clip(
            record.path, start, min(DECODE_CHUNK_FRAMES, first + count - start), 1, record.first_pts
        )
        source = frames.shape[1:3]
        pixels = torch.from_numpy(frames).to(device).permute(0, 3, 1, 2).float()
        chunks.append(F.interpolate(pixels, size=size, mode="bilinear", align_corners=True))
    return torch.cat(chunks)[None], (int(source[0]), int(source[1]))


_COTRACKER_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def _cotracker_model(cls, checkpoint: str, device: str) -> torch.nn.Module:
    """One predictor per checkpoint and device per process (loading costs seconds per video otherwise)."""
    key = (checkpoint, device)
    if key not in _COTRACKER_MODELS:
        _COTRACKER_MODELS[key] = cls(checkpoint=checkpoint).to(device).eval()
    return _COTRACKER_MODELS[key]


def cotracker_problems(checkpoint: Path | None, where: str = "data.tracks") -> list[ConfigProblem]:
    """What stops CoTracker from running here, with both fixes named."""
    problems = []
    try:
        import cotracker.predictor  # noqa: F401
    except ImportError:
        problems.append(
            ConfigProblem(
                f"{where}.tracker",
                "the cotracker package is not installed: install Meta's co-tracker repository "
                "(`pip install git+https://github.com/facebookresearch/co-tracker`), or use tracker: "
                "analytic with data.source.builtin synthetic_clips.",
            )
        )
    if checkpoint is None or not Path(checkpoint).expanduser().is_file():
        problems.append(
            ConfigProblem(
                f"{where}.cotracker_checkpoint",
                f"{checkpoint} is not a file: download a CoTracker checkpoint (e.g. scaled_offline.pth) once "
                "and point this key at it; nothing is downloaded at run time.",
            )
        )
    return problems
