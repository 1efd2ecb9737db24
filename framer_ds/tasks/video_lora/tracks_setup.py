"""`data.tracks` for video_lora: checks, the track store, `framer-ds data tracks`, and the datasets
whose items carry `controlnet_cond` (the contract is in framer_ds/data/track_heatmaps.py)."""

from __future__ import annotations

from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.data.point_tracks import TrackStore, cotracker_problems, make_tracker
from framer_ds.data.track_heatmaps import PointSelection, TrackConditionedDataset
from framer_ds.data.video_index import VideoRecord
from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.config import TrackOptions, VideoLoraDataConfig
from framer_ds.tasks.video_lora.data_setup import VideoLoraData


def track_problems(data: VideoLoraDataConfig) -> list[ConfigProblem]:
    """What `data.tracks` needs from the rest of the data config and from this machine, all at once."""
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
    if tracks.tracker == "analytic" and data.builtin != "synthetic_clips":
        problems.append(
            ConfigProblem(
                "data.tracks.tracker",
                "analytic tracks exist only for data.builtin: synthetic_clips; use tracker: cotracker "
                "(with data.tracks.cotracker_checkpoint) for real videos.",
            )
        )
    if tracks.tracker == "cotracker":
        problems += cotracker_problems(tracks.cotracker_checkpoint)
    return problems


def track_store(tracks: TrackOptions) -> TrackStore:
    root = tracks.dir or default_cache_dir() / "point_tracks"
    return TrackStore(root, make_tracker(tracks.tracker, tracks.cotracker_checkpoint, tracks.grid_size))


def build_tracks(video_data: VideoLoraData) -> str:
    """Track every indexed video not yet tracked; a second run reuses the files. Returns a summary."""
    tracks = video_data.config.tracks
    store = track_store(tracks)
    records = video_data.index().records
    computed, reused = store.build(records)
    return (
        f"point tracks ({tracks.tracker}): {computed + reused} videos in {store.directory} "
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
