"""Which tracker a run uses: the analytic one (synthetic clips) or CoTracker (real videos).

Why a module of its own: the choice needs both trackers, and CoTracker's wrapper builds on
point_tracks' formats; here the choice imports both one way, where point_tracks once imported the
wrapper lazily and the wrapper imported point_tracks (a cycle, issue 32).
"""

from __future__ import annotations

from pathlib import Path

from framer_ds.config.errors import ConfigError
from framer_ds.tasks.video_lora.framer.tracks.cotracker import CoTrackerTracker, cotracker_problems
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import AnalyticTracker, Tracker


def make_tracker(
    kind: str, checkpoint: Path | None = None, grid_size: int = 10, segment_frames: int = 96
) -> Tracker:
    """`data.tracks.tracker`'s tracker; CoTracker's missing package or checkpoint is one ConfigError
    naming both fixes, before any video is read."""
    if kind == "analytic":
        return AnalyticTracker()
    if kind == "cotracker":
        problems = cotracker_problems(checkpoint)
        if problems:
            raise ConfigError(problems, source="data.tracks")
        return CoTrackerTracker(Path(checkpoint).expanduser(), grid_size, segment_frames)
    raise ValueError(f"unknown tracker {kind!r}; use 'analytic' or 'cotracker'")
