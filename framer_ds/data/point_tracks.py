"""Point tracks per video, computed once at the source frame rate, and carried onto each training clip.

Why per video and at the source rate: a clip is a start, a stride, a resize + crop and maybe a flip of
its video, drawn anew each epoch (or once per cached clip). Tracking each clip would cost a tracker
run per sample; tracking each video once and mapping the tracks through the clip's `ClipPlacement`
(the exact parameters the video loader used) costs nothing per sample and is exact.

Conventions: x, y in pixels of the source frame, pixel centres at integers (pixel (0, 0) spans
-0.5..0.5), as CoTracker reports them. Points outside the frame after the crop are invisible.

Trackers: `AnalyticTracker` for the built-in synthetic clips (the square's position is known in every
frame, `synthetic_video.MovingShape`) and `CoTrackerTracker` (Meta's CoTracker, when the `cotracker`
package is installed and a local checkpoint file is configured; nothing is downloaded).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError
from framer_ds.data.synthetic_video import MovingShape, clip_seed
from framer_ds.data.video_clips import ClipPlacement, clip_indices, read_clip
from framer_ds.data.video_index import VideoRecord
from framer_ds.storage.atomic import atomic_file

TRACKS_FORMAT_VERSION = 1


@dataclass
class Tracks:
    """xy float32 [N, P, 2] (x, y in source pixels) and visible bool [N, P] for every source frame."""

    xy: np.ndarray
    visible: np.ndarray
    height: int
    width: int

    def __post_init__(self) -> None:
        self.xy = np.asarray(self.xy, dtype=np.float32)
        self.visible = np.asarray(self.visible, dtype=bool)
        if self.xy.ndim != 3 or self.xy.shape[-1] != 2 or self.visible.shape != self.xy.shape[:2]:
            raise ValueError(
                f"need xy [N, P, 2] and visible [N, P]; got {self.xy.shape}, {self.visible.shape}"
            )

    @property
    def num_frames(self) -> int:
        return self.xy.shape[0]

    def save(self, path: Path) -> None:
        """Atomic .npz: a killed run leaves a temp file, never a truncated track file."""
        with atomic_file(Path(path)) as tmp, open(tmp, "wb") as handle:
            np.savez(
                handle,
                xy=self.xy,
                visible=self.visible,
                size=np.array([self.height, self.width]),
                version=np.array(TRACKS_FORMAT_VERSION),
            )

    @classmethod
    def load(cls, path: Path) -> Tracks:
        try:
            with np.load(Path(path)) as data:
                if int(data["version"]) != TRACKS_FORMAT_VERSION:
                    raise ValueError(f"format {int(data['version'])}, expected {TRACKS_FORMAT_VERSION}")
                height, width = (int(v) for v in data["size"])
                return cls(data["xy"], data["visible"], height, width)
        except (OSError, KeyError, ValueError) as exc:
            raise InputDataError(
                f"track file {path} is unreadable ({type(exc).__name__}: {exc}); delete it and run "
                "`framer-ds data tracks CONFIG` again."
            ) from exc


def clip_tracks(tracks: Tracks, placement: ClipPlacement) -> tuple[np.ndarray, np.ndarray]:
    """(xy [F, P, 2] float32 in the clip's pixels, visible [F, P]): the tracks at the clip's frames, through
    its resize (pixel centres scale about the half-pixel grid, as bilinear resizing maps them), crop and
    flip; a point outside the cropped frame is invisible."""
    box = placement.box
    if (box.src_h, box.src_w) != (tracks.height, tracks.width):
        raise InputDataError(
            f"tracks are for {tracks.width}x{tracks.height} frames, the clip was read at "
            f"{box.src_w}x{box.src_h}; the video changed: run `framer-ds data tracks CONFIG` again."
        )
    frames = clip_indices(placement.start, placement.num_frames, placement.stride)
    if frames[-1] >= tracks.num_frames:
        raise InputDataError(
            f"tracks cover {tracks.num_frames} frames, the clip needs frame {frames[-1]}; the video "
            "changed: run `framer-ds data tracks CONFIG` again."
        )
    xy = tracks.xy[frames].astype(np.float64)
    x = (xy[..., 0] + 0.5) * (box.new_w / box.src_w) - 0.5 - box.left
    y = (xy[..., 1] + 0.5) * (box.new_h / box.src_h) - 0.5 - box.top
    if placement.flipped:
        x = (box.width - 1) - x
    inside = (x >= 0) & (x < box.width) & (y >= 0) & (y < box.height)
    return np.stack([x, y], axis=-1).astype(np.float32), tracks.visible[frames] & inside


class Tracker(Protocol):
    """Computes the tracks of one whole video; `fingerprint` names what decides them (the track files
    of different trackers or settings live in different directories)."""

    def fingerprint(self) -> str: ...

    def track(self, record: VideoRecord) -> Tracks: ...


@dataclass(frozen=True)
class AnalyticTracker:
    """Exact tracks of the built-in synthetic clips: the square's centre and four inner points (moving
    together), and a 3 x 3 grid of background points, static and hidden while the square covers them."""

    def fingerprint(self) -> str:
        return f"analytic-v{TRACKS_FORMAT_VERSION}"

    def track(self, record: VideoRecord) -> Tracks:
        seed = clip_seed(record.path)
        if seed is None:
            raise InputDataError(
                f"{record.path} is not a built-in synthetic clip (clip_NNN.mp4): analytic tracks exist only "
                "for data.builtin synthetic_clips; set data.tracks.tracker: cotracker for real videos."
            )
        shape = MovingShape.from_seed(record.width, record.height, seed)
        return analytic_tracks(shape, record.num_frames)


def analytic_tracks(shape: MovingShape, num_frames: int) -> Tracks:
    """Tracks of `shape` over frames 0..num_frames-1 (see AnalyticTracker)."""
    s, inset = shape.size, shape.size // 4
    on_square = np.array([[(s - 1) / 2, (s - 1) / 2], [inset, inset], [s - 1 - inset, inset],
                          [inset, s - 1 - inset], [s - 1 - inset, s - 1 - inset]])  # fmt: skip
    grid = np.array(
        [[(i + 0.5) * shape.width / 3, (j + 0.5) * shape.height / 3] for j in range(3) for i in range(3)]
    )
    grid = np.floor(grid)
    xy = np.zeros((num_frames, len(on_square) + len(grid), 2))
    visible = np.ones(xy.shape[:2], dtype=bool)
    for t in range(num_frames):
        corner = np.array(shape.corner(t), dtype=np.float64)
        xy[t, : len(on_square)] = corner + on_square
        xy[t, len(on_square) :] = grid
        covered = np.all((grid >= corner) & (grid < corner + s), axis=1)
        visible[t, len(on_square) :] = ~covered
    return Tracks(xy, visible, shape.height, shape.width)


@dataclass(frozen=True)
class CoTrackerTracker:
    """Meta's CoTracker (offline predictor) on a regular grid of `grid_size` x `grid_size` points."""

    checkpoint: Path
    grid_size: int = 10

    def fingerprint(self) -> str:
        stat = Path(self.checkpoint).stat()
        digest = hashlib.sha256(f"{Path(self.checkpoint).name}|{stat.st_size}|{self.grid_size}".encode())
        return f"cotracker-{digest.hexdigest()[:12]}"

    def track(self, record: VideoRecord) -> Tracks:  # pragma: no cover - needs cotracker and weights
        from cotracker.predictor import CoTrackerPredictor

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = _cotracker_model(CoTrackerPredictor, str(self.checkpoint), device)
        frames = read_clip(record.path, 0, record.num_frames, 1, record.first_pts)
        video = torch.from_numpy(frames).permute(0, 3, 1, 2)[None].float().to(device)
        with torch.no_grad():
            xy, visible = model(video, grid_size=self.grid_size)
        return Tracks(xy[0].cpu().numpy(), visible[0].cpu().numpy() > 0.5, frames.shape[1], frames.shape[2])


_COTRACKER_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def _cotracker_model(cls, checkpoint: str, device: str) -> torch.nn.Module:  # pragma: no cover
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
                "analytic with data.builtin synthetic_clips.",
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


def make_tracker(kind: str, checkpoint: Path | None = None, grid_size: int = 10) -> Tracker:
    if kind == "analytic":
        return AnalyticTracker()
    if kind == "cotracker":
        problems = cotracker_problems(checkpoint)
        if problems:
            raise ConfigError(problems, source="data.tracks")
        return CoTrackerTracker(Path(checkpoint).expanduser(), grid_size)
    raise ValueError(f"unknown tracker {kind!r}; use 'analytic' or 'cotracker'")


def _safe_stem(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).stem)[:64]


@dataclass
class TrackStore:
    """`root/<tracker fingerprint>/<video stem>-<hash of path, size, mtime>.npz`: one file per video; an
    edited video gets a new file, another tracker or grid another directory."""

    root: Path
    tracker: Tracker

    @property
    def directory(self) -> Path:
        return Path(self.root).expanduser() / self.tracker.fingerprint()

    def path_for(self, record: VideoRecord) -> Path:
        stat = Path(record.path).stat()
        source = f"{Path(record.path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        return self.directory / f"{_safe_stem(record.path)}-{digest}.npz"

    def build(self, records: Iterable[VideoRecord]) -> tuple[int, int]:
        """Tracks for every video not yet on disk; returns (computed, reused)."""
        computed = reused = 0
        seen: set[Path] = set()
        for record in records:
            path = self.path_for(record)
            if path in seen:  # manifest segments of one file share its tracks
                continue
            seen.add(path)
            if path.is_file():
                reused += 1
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            self.tracker.track(record).save(path)
            computed += 1
        return computed, reused

    def load(self, record: VideoRecord) -> Tracks:
        path = self.path_for(record)
        if not path.is_file():
            raise InputDataError(
                f"no point tracks for {record.path} in {self.directory}: run `framer-ds data tracks CONFIG` "
                "first (it tracks every video once and is resumable)."
            )
        return Tracks.load(path)
