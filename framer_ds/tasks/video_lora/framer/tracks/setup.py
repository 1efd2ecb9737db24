"""`data.tracks` of a Framer base: checks, the track store and tracker, `framer-ds data tracks`, and the
datasets whose items carry `controlnet_cond` (the contract is in framer/tracks/heatmaps.py)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.framer.options import TrackOptions
from framer_ds.tasks.video_lora.framer.tracks.cotracker import cotracker_problems
from framer_ds.tasks.video_lora.framer.tracks.heatmaps import PointSelection, TrackConditionedDataset
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import TrackStore, longest_clip_span, max_clip_span
from framer_ds.tasks.video_lora.framer.tracks.trackers import make_tracker
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord
from framer_ds.tasks.video_lora.shared.data_setup import VideoLoraData


def track_problems(data: Any) -> list[ConfigProblem]:
    """What `data.tracks` needs from the rest of the config and from this machine, all at once."""
    tracks = data.tracks
    if tracks is None:
        return []
    problems = []
    if data.layout != "videos":
        problems.append(
            ConfigProblem(
                "data.tracks", "point tracks need videos: set data.layout: videos or drop data.tracks."
            )
        )
    if tracks.tracker == "analytic" and data.source.builtin != "synthetic_clips":
        problems.append(
            ConfigProblem(
                "data.tracks.tracker",
                "analytic tracks exist only for data.source.builtin: synthetic_clips; use tracker: cotracker "
                "(with data.tracks.cotracker_checkpoint) for real videos.",
            )
        )
    if tracks.tracker == "cotracker":
        problems += cotracker_problems(tracks.cotracker_checkpoint)
        span = longest_clip_span(data.num_frames, data.max_stride)
        if span > max_clip_span(tracks.segment_frames):
            problems.append(
                ConfigProblem(
                    "data.tracks.segment_frames",
                    f"{tracks.segment_frames} is too short: a clip of {data.num_frames} frames at stride "
                    f"{data.max_stride} spans {span} source frames, and a window holds every such clip only "
                    f"when segment_frames >= {2 * (span - 1)}; raise it (or lower data.num_frames/stride).",
                )
            )
    return problems


def track_store(tracks: TrackOptions) -> TrackStore:
    root = tracks.dir or default_cache_dir() / "point_tracks"
    tracker = make_tracker(
        tracks.tracker, tracks.cotracker_checkpoint, tracks.grid_size, tracks.segment_frames
    )
    return TrackStore(root, tracker)


def build_tracks(video_data: VideoLoraData, shard: tuple[int, int] = (0, 1)) -> str:
    """Track every indexed video not yet tracked (this process's `shard` of them: rank, world size); a
    second run reuses the files. Returns a summary."""
    tracks = video_data.config.tracks
    store = track_store(tracks)
    records = video_data.index().records
    computed, reused = store.build(records, shard)
    share = f"rank {shard[0]} of {shard[1]}: " if shard[1] > 1 else ""
    return (
        f"point tracks ({tracks.tracker}): {share}{computed + reused} videos in {store.directory} "
        f"({computed} tracked, {reused} reused)"
    )


def with_controlnet_cond(
    dataset: Dataset | None, records: list[VideoRecord], tracks: TrackOptions, seed: int
) -> TrackConditionedDataset | None:
    """Items of `dataset` (with "video_id" and "placement") plus "controlnet_cond"."""
    if dataset is None:
        return None
    selection = PointSelection(tracks.min_points, tracks.num_points, tracks.dropout, tracks.moving_bias)
    return TrackConditionedDataset(dataset, track_store(tracks), records, selection, seed)
