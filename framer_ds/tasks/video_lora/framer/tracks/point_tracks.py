"""Point tracks per video, computed once at the source frame rate, and carried onto each training clip.

Why per video and at the source rate: a clip is a start, a stride, a resize + crop and maybe a flip of
its video, drawn anew each epoch (or once per cached clip). Tracking each clip would cost a tracker
run per sample; tracking each video once and mapping the tracks through the clip's `ClipPlacement`
(the exact parameters the video loader used) costs nothing per sample and is exact.

Conventions: x, y in pixels of the source frame, pixel centres at integers (pixel (0, 0) spans
-0.5..0.5), as CoTracker reports them. Points outside the frame after the crop are invisible.

Segments: a tracker may split a video into overlapping windows, each with its own points (a grid
queried at a window's first frame loses most of its points a few seconds later, and a clip late in the
video would get none). A video's `VideoTracks` is its list of `Tracks` windows; a clip takes the points
of the latest window that holds all of its frames.

Trackers: `AnalyticTracker` for the built-in synthetic clips (the square's position is known in every
frame, `synthetic_video.MovingShape`; one window) and `cotracker_tracker.CoTrackerTracker` (Meta's
CoTracker, when the `cotracker` package is installed and a local checkpoint file is configured; nothing
is downloaded).
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from framer_ds.config.errors import InputDataError
from framer_ds.storage.atomic import atomic_file
from framer_ds.tasks.video_lora.shared.data.clip_reader import clip_indices
from framer_ds.tasks.video_lora.shared.data.synthetic_video import MovingShape, clip_seed
from framer_ds.tasks.video_lora.shared.data.video_clips import ClipPlacement
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord

TRACKS_FORMAT_VERSION = 2


@dataclass
class Tracks:
    """One window of a video: xy float32 [N, P, 2] (x, y in source pixels) and visible bool [N, P] for
    source frames first_frame .. first_frame + N - 1."""

    xy: np.ndarray
    visible: np.ndarray
    height: int
    width: int
    first_frame: int = 0

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

    @property
    def last_frame(self) -> int:
        return self.first_frame + self.num_frames - 1


@dataclass
class VideoTracks:
    """All windows of one video (at least one, all of the same frame size), saved as one file."""

    segments: list[Tracks]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a video's tracks need at least one window")
        sizes = {(segment.height, segment.width) for segment in self.segments}
        if len(sizes) != 1:
            raise ValueError(f"the windows of one video have different frame sizes: {sorted(sizes)}")
        self.segments = sorted(self.segments, key=lambda segment: segment.first_frame)

    @property
    def height(self) -> int:
        return self.segments[0].height

    @property
    def width(self) -> int:
        return self.segments[0].width

    @property
    def num_frames(self) -> int:
        """Source frames covered: through the last frame of the last-ending window."""
        return max(segment.last_frame for segment in self.segments) + 1

    def window_for(self, first: int, last: int) -> Tracks:
        """The latest-starting window holding frames first..last (its points were chosen closest to the
        clip, so most are still in view)."""
        holding = [s for s in self.segments if s.first_frame <= first and last <= s.last_frame]
        if not holding:
            windows = ", ".join(f"{s.first_frame}-{s.last_frame}" for s in self.segments)
            raise InputDataError(
                f"no track window holds source frames {first}-{last} (windows: {windows}); a clip spans "
                "more source frames than data.tracks.segment_frames allows (at most half of it + 1), or "
                "the video changed: raise segment_frames and run `framer-ds data tracks CONFIG` again."
            )
        return holding[-1]

    def save(self, path: Path) -> None:
        """Atomic .npz: a killed run leaves a temp file, never a truncated track file."""
        arrays = {"size": np.array([self.height, self.width]), "version": np.array(TRACKS_FORMAT_VERSION)}
        arrays["first_frames"] = np.array([segment.first_frame for segment in self.segments])
        for number, segment in enumerate(self.segments):
            arrays[f"xy_{number}"], arrays[f"visible_{number}"] = segment.xy, segment.visible
        with atomic_file(Path(path)) as tmp, open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path: Path) -> VideoTracks:
        try:
            with np.load(Path(path)) as data:
                if int(data["version"]) != TRACKS_FORMAT_VERSION:
                    raise ValueError(f"format {int(data['version'])}, expected {TRACKS_FORMAT_VERSION}")
                height, width = (int(v) for v in data["size"])
                return cls(
                    [
                        Tracks(data[f"xy_{number}"], data[f"visible_{number}"], height, width, int(first))
                        for number, first in enumerate(data["first_frames"])
                    ]
                )
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise InputDataError(
                f"track file {path} is unreadable ({type(exc).__name__}: {exc}); delete it and run "
                "`framer-ds data tracks CONFIG` again."
            ) from exc


def window_starts(num_frames: int, segment_frames: int) -> list[int]:
    """First frames of windows of `segment_frames` (the last one ends at the video's end) spaced at most
    half a window apart, so any span of segment_frames // 2 + 1 frames (or fewer) lies inside one."""
    if num_frames <= segment_frames:
        return [0]
    hop = segment_frames - max_clip_span(segment_frames) + 1
    return sorted({*range(0, num_frames - segment_frames + 1, hop), num_frames - segment_frames})


def max_clip_span(segment_frames: int) -> int:
    """Source frames a clip may span so that some window of `segment_frames` holds it (`window_starts`)."""
    return segment_frames // 2 + 1


def longest_clip_span(num_frames: int, max_stride: int) -> int:
    """Source frames a clip of `num_frames` at stride `max_stride` spans."""
    return (num_frames - 1) * max_stride + 1


def clip_tracks(tracks: VideoTracks | Tracks, placement: ClipPlacement) -> tuple[np.ndarray, np.ndarray]:
    """(xy [F, P, 2] float32 in the clip's pixels, visible [F, P]): the points of the window holding the
    clip's frames, at those frames, through its resize (pixel centres scale about the half-pixel grid,
    as bilinear resizing maps them), crop and flip; a point outside the cropped frame is invisible."""
    box = placement.box
    if (box.src_h, box.src_w) != (tracks.height, tracks.width):
        raise InputDataError(
            f"tracks are for {tracks.width}x{tracks.height} frames, the clip was read at "
            f"{box.src_w}x{box.src_h}; the video changed: run `framer-ds data tracks CONFIG` again."
        )
    frames = np.asarray(clip_indices(placement.start, placement.num_frames, placement.stride))
    video = tracks if isinstance(tracks, VideoTracks) else VideoTracks([tracks])
    if frames[-1] >= video.num_frames:
        raise InputDataError(
            f"tracks cover {video.num_frames} frames, the clip needs frame {frames[-1]}; the video "
            "changed: run `framer-ds data tracks CONFIG` again."
        )
    tracks = video.window_for(int(frames[0]), int(frames[-1]))
    frames = frames - tracks.first_frame
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

    def track(self, record: VideoRecord) -> VideoTracks: ...


@dataclass(frozen=True)
class AnalyticTracker:
    """Exact tracks of the built-in synthetic clips: the square's centre and four inner points (moving
    together), and a 3 x 3 grid of background points, static and hidden while the square covers them;
    one window (the square never leaves the frame)."""

    def fingerprint(self) -> str:
        return f"analytic-v{TRACKS_FORMAT_VERSION}"

    def track(self, record: VideoRecord) -> VideoTracks:
        seed = clip_seed(record.path)
        if seed is None:
            raise InputDataError(
                f"{record.path} is not a built-in synthetic clip (clip_NNN.mp4): analytic tracks exist only "
                "for data.source.builtin synthetic_clips; set data.tracks.tracker: cotracker for real videos."
            )
        shape = MovingShape.from_seed(record.width, record.height, seed)
        return VideoTracks([analytic_tracks(shape, record.num_frames)])


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

    def build(self, records: Iterable[VideoRecord], shard: tuple[int, int] = (0, 1)) -> tuple[int, int]:
        """Tracks for every video not yet on disk; returns (computed, reused). `shard` (rank, world
        size): this process takes every world-th video from its rank on, so N launched processes track
        a disjoint share each (files are written atomically, so overlapping runs only cost time)."""
        rank, world = shard
        paths = {self.path_for(record): record for record in records}  # segments of one file share it
        computed = reused = 0
        for path, record in list(paths.items())[rank::world]:
            if path.is_file():
                reused += 1
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            self.tracker.track(record).save(path)
            computed += 1
        return computed, reused

    def load(self, record: VideoRecord) -> VideoTracks:
        path = self.path_for(record)
        if not path.is_file():
            raise InputDataError(
                f"no point tracks for {record.path} in {self.directory}: run `framer-ds data tracks CONFIG` "
                "first (it tracks every video once and is resumable)."
            )
        return VideoTracks.load(path)
