"""Trackers, their windows and the track store: CoTracker's wiring (a stand-in with its interface;
the package is not on PyPI), the windows every clip fits in, the store's files and what a damaged or
missing one says (tests/tasks/video_lora/framer/test_point_tracks.py covers tracks through clips, heatmaps and
the items)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framer_ds.config.errors import ConfigError, InputDataError
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import (
    AnalyticTracker,
    Tracks,
    TrackStore,
    VideoTracks,
    analytic_tracks,
    clip_tracks,
    window_starts,
)
from framer_ds.tasks.video_lora.framer.tracks.trackers import make_tracker
from framer_ds.tasks.video_lora.shared.data.clip_reader import read_clip
from framer_ds.tasks.video_lora.shared.data.synthetic_video import MovingShape, ensure_synthetic_clips
from framer_ds.tasks.video_lora.shared.data.video_clips import ClipPlacement, CropBox
from framer_ds.tasks.video_lora.shared.data.video_index import build_video_index


def _placement(box: CropBox, start: int, stride: int, frames: int, flipped: bool) -> ClipPlacement:
    return ClipPlacement(start, stride, frames, box, flipped)


def test_cotracker_missing_names_both_fixes(tmp_path):
    try:
        import cotracker  # noqa: F401

        pytest.skip("cotracker is installed here")
    except ImportError:
        pass
    with pytest.raises(ConfigError) as info:
        make_tracker("cotracker", tmp_path / "missing.pth")
    text = str(info.value)
    assert "pip install" in text and "cotracker_checkpoint" in text and "missing.pth" in text


def test_store_keys_files_by_video_and_tracker(tmp_path):
    clips = ensure_synthetic_clips(tmp_path / "clips", count=2, frames=8)
    records = build_video_index(clips, None, 4, cache_dir=tmp_path / "index").records
    store = TrackStore(tmp_path / "tracks", AnalyticTracker())
    assert store.build(records) == (2, 0) and store.build(records) == (0, 2)
    (tracks,) = store.load(records[0]).segments
    expected = analytic_tracks(MovingShape.from_seed(96, 80, seed=0), 8)
    assert np.array_equal(tracks.xy, expected.xy) and np.array_equal(tracks.visible, expected.visible)


def _fake_cotracker(monkeypatch, shape: MovingShape, first_frames: list[int]) -> dict:
    """A stand-in `cotracker.predictor` with CoTracker's interface (offline predictor: float video
    [1, T, 3, H, W] 0..255 in, grid_size in, tracks [1, T, P, 2] in the input's pixels and bool
    visibility out, `interp_shape` (h, w)) that returns the synthetic clip's analytic tracks, in the
    coordinates CoTracker reports for an input at interp_shape (align_corners scaling)."""
    import sys
    import types

    from framer_ds.tasks.video_lora.framer.tracks import cotracker as cotracker_tracker

    calls: dict = {"videos": []}

    class FakePredictor(torch.nn.Module):
        interp_shape = (48, 64)

        def __init__(self, checkpoint):
            super().__init__()
            calls["checkpoint"] = checkpoint

        def forward(self, video, grid_size):
            calls["videos"].append(video)
            calls["grid"] = grid_size
            first = first_frames[len(calls["videos"]) - 1]
            truth = analytic_tracks(shape, first + video.shape[1])
            xy = truth.xy[first:] * np.array([63 / (shape.width - 1), 47 / (shape.height - 1)], np.float32)
            return torch.from_numpy(xy)[None], torch.from_numpy(truth.visible[first:])[None]

    package = types.ModuleType("cotracker")
    predictor = types.ModuleType("cotracker.predictor")
    predictor.CoTrackerPredictor = FakePredictor
    monkeypatch.setitem(sys.modules, "cotracker", package)
    monkeypatch.setitem(sys.modules, "cotracker.predictor", predictor)
    monkeypatch.setattr(cotracker_tracker, "_COTRACKER_MODELS", {})
    return calls


def test_cotracker_tracks_windows_at_model_size_and_maps_them_back(tmp_path, monkeypatch):
    """The wiring around CoTracker (its package and weights are not here; the same calls were run once
    against facebookresearch/co-tracker 82e02e8 with random weights): each window of the video goes in
    decoded at the model's size as float [1, T, 3, h, w] 0..255, and the tracks that come back land on
    the analytic tracks of that window in source pixels."""
    import torch.nn.functional as F

    clips = ensure_synthetic_clips(tmp_path / "clips", count=1, frames=24)
    record = build_video_index(clips, None, 4, cache_dir=tmp_path / "index").records[0]
    shape = MovingShape.from_seed(record.width, record.height, 0)
    assert window_starts(24, 10) == [0, 5, 10, 14]
    calls = _fake_cotracker(monkeypatch, shape, window_starts(24, 10))
    weights = tmp_path / "scaled_offline.pth"
    weights.write_bytes(b"0")
    tracker = make_tracker("cotracker", weights, grid_size=3, segment_frames=10)
    tracks = tracker.track(record)
    assert calls["checkpoint"] == str(weights) and calls["grid"] == 3
    assert [s.first_frame for s in tracks.segments] == [0, 5, 10, 14]
    whole = read_clip(record.path, 0, 24, 1)
    for first, video in zip([0, 5, 10, 14], calls["videos"], strict=True):
        assert video.shape == (1, 10, 3, 48, 64) and video.dtype == torch.float32
        expected = F.interpolate(
            torch.from_numpy(whole[first : first + 10]).permute(0, 3, 1, 2).float(),
            size=(48, 64),
            mode="bilinear",
            align_corners=True,
        )
        assert torch.allclose(video[0], expected)
    truth = analytic_tracks(shape, 24)
    for segment in tracks.segments:
        assert (segment.height, segment.width) == (80, 96)
        rows = slice(segment.first_frame, segment.last_frame + 1)
        np.testing.assert_allclose(segment.xy, truth.xy[rows], atol=1e-4)
        assert np.array_equal(segment.visible, truth.visible[rows])
    assert tracker.fingerprint() != make_tracker("cotracker", weights, 3, 12).fingerprint()


def test_windows_hold_every_clip_and_a_clip_takes_the_latest():
    for frames, length in [(24, 10), (100, 96), (97, 96), (300, 96), (7, 96), (50, 2), (51, 3)]:
        starts = window_starts(frames, length)
        assert starts[0] == 0 and (frames <= length or starts[-1] == frames - length)
        span = min(frames, length // 2 + 1)
        for first in range(frames - span + 1):
            assert any(s <= first and first + span - 1 <= s + length - 1 for s in starts), (frames, length)
    truth = analytic_tracks(MovingShape.from_seed(96, 80, seed=3), 24)
    windows = VideoTracks(
        [
            Tracks(truth.xy[s : s + 10] + s, truth.visible[s : s + 10], 80, 96, first_frame=s)
            for s in window_starts(24, 10)
        ]
    )
    box = CropBox(80, 96, 80, 96, top=0, left=0, height=80, width=96)
    xy, _ = clip_tracks(windows, _placement(box, 6, 2, 3, False))  # frames 6, 8, 10: windows 0 and 5
    np.testing.assert_allclose(xy, truth.xy[[6, 8, 10]] + 5)  # the later one
    with pytest.raises(InputDataError, match="segment_frames"):
        clip_tracks(windows, _placement(box, 0, 4, 4, False))  # frames 0..12 fit no window


def test_a_window_too_short_for_the_clips_is_a_config_error():
    from framer_ds.tasks.video_lora.config import VideoLoraDataConfig
    from framer_ds.tasks.video_lora.framer.tracks.setup import track_problems

    data = VideoLoraDataConfig.model_validate(
        {
            "source": {"path": "videos"},
            "num_frames": 10,
            "stride": None,
            "stride_range": [1, 4],
            "tracks": {"tracker": "cotracker", "segment_frames": 60},
        }
    )
    problems = {p.where: p.message for p in track_problems(data)}
    assert "segment_frames >= 72" in problems["data.tracks.segment_frames"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "old_format"])
def test_a_damaged_track_file_is_named_with_the_fix(tmp_path, damage):
    clips = ensure_synthetic_clips(tmp_path / "clips", count=1, frames=8)
    (record,) = build_video_index(clips, None, 4, cache_dir=tmp_path / "index").records
    store = TrackStore(tmp_path / "tracks", AnalyticTracker())
    store.build([record])
    path = store.path_for(record)
    if damage == "truncated":  # a copy cut short (the store itself writes atomically)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a track file")
    else:  # a file of the first format: xy/visible, no windows
        np.savez(path, xy=np.zeros((8, 1, 2)), visible=np.ones((8, 1), bool), size=np.array([80, 96]),
                 version=np.array(1))  # fmt: skip
    with pytest.raises(InputDataError, match="delete it and run `framer-ds data tracks CONFIG` again"):
        store.load(record)
