"""Point tracks and Framer's trajectory heatmaps (`controlnet_cond`): the raster against a golden array
built from Framer's formula, tracks through stride/crop/resize/flip against the synthetic clips'
analytic positions, point selection, `framer-ds data tracks`, and the items (trackers, windows and the
store: tests/tasks/video_lora/framer/test_track_store.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from framer_ds.tasks.video_lora.framer.tracks.heatmaps import (
    PointSelection,
    TrackConditionedDataset,
    gaussian_template,
    heatmap_conditioning,
    point_motion,
    resize_template,
    select_points,
)
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import (
    Tracks,
    VideoTracks,
    analytic_tracks,
    clip_tracks,
)
from framer_ds.tasks.video_lora.shared.data.clip_reader import read_clip
from framer_ds.tasks.video_lora.shared.data.latent_cache import CachedEntryDataset, LatentCache
from framer_ds.tasks.video_lora.shared.data.synthetic_video import MovingShape
from framer_ds.tasks.video_lora.shared.data.video_clips import (
    ClipPlacement,
    CropBox,
    apply_crop_box,
    crop_box,
)

FRAMER_TINY = Path(__file__).resolve().parents[4] / "configs" / "tasks" / "video_lora" / "framer_tiny.yaml"

# --- the golden heatmap ----------------------------------------------------------------------------


def framer_template() -> np.ndarray:
    """Framer's `gen_gaussian_heatmap` (models_diffusers/utils.py lines 15-32 of aim-uofa/Framer
    d0ba81f), written out again: the density 1/(2 pi 40^2) exp(-((i-100)^2 + (j-100)^2) / (2 40^2)) per
    pixel, stored as float32, times the filled cv2.circle of radius 100 at (100, 100) (for these numbers
    exactly the pixels with (i-100)^2 + (j-100)^2 <= 100^2), normalised twice, *255, cast to uint8."""
    image = np.zeros((200, 200), np.float32)
    for i in range(200):
        for j in range(200):
            image[i, j] = (
                1 / 2 / np.pi / (40**2) * np.exp(-1 / 2 * ((i - 100) ** 2 / 40**2 + (j - 100) ** 2 / 40**2))
            )
    ii, jj = np.mgrid[:200, :200]
    image = image * ((ii - 100) ** 2 + (jj - 100) ** 2 <= 100**2).astype(np.float32)
    image = (image / np.max(image)).astype(np.float32)
    return (image / np.max(image) * 255).astype(np.uint8)


def cv2_linear_resize(src: np.ndarray, width: int, height: int) -> np.ndarray:
    """cv2.resize(src, (width, height)) for uint8 INTER_LINEAR, pixel by pixel: source position
    (d + 0.5) * src/dst - 0.5 in float32, weights rounded to 1/2048, rows combined as OpenCV's vector
    code does ((row >> 4) * w >> 16 per row, + 2, >> 2)."""

    def taps(n_src: int, n_dst: int, d: int) -> tuple[int, int, int]:
        pos = np.float32((d + 0.5) * (1.0 / (n_dst / n_src)) - 0.5)
        left = math.floor(pos)
        frac = np.float32(pos - np.float32(left))
        if left < 0 or left >= n_src - 1:
            left, frac = min(max(left, 0), n_src - 1), np.float32(0)
        return left, int(np.round((np.float32(1) - frac) * 2048)), int(np.round(frac * 2048))

    out = np.zeros((height, width), np.uint8)
    for y in range(height):
        top, a, b = taps(src.shape[0], height, y)
        for x in range(width):
            left, c, d = taps(src.shape[1], width, x)
            right = min(left + 1, src.shape[1] - 1)
            below = min(top + 1, src.shape[0] - 1)
            upper = int(src[top, left]) * c + int(src[top, right]) * d
            lower = int(src[below, left]) * c + int(src[below, right]) * d
            out[y, x] = min(255, (((upper >> 4) * a >> 16) + ((lower >> 4) * b >> 16) + 2) >> 2)
    return out


def framer_heatmap(xy: np.ndarray, visible: np.ndarray, height: int, width: int) -> np.ndarray:
    """Framer's `generate_gassian_heatmap` + `draw_heatmap` (models_diffusers/utils.py lines 35-85):
    per frame a zero float32 image; each point inside the frame and visible pastes the template resized
    to the box int(max(c - 20, 1)) .. int(min(c + 20, size - 1)) (skipped when empty); uint8, grey -> RGB,
    [F, 3, H, W]."""
    template = framer_template()
    frames = []
    for f in range(xy.shape[0]):
        image = np.zeros((height, width), np.float32)
        for p in range(xy.shape[1]):
            px, py = xy[f, p]
            if px < 0 or py < 0 or px >= width or py >= height or not visible[f, p]:
                continue
            x1, x2 = int(max(px - 20, 1)), int(min(px + 20, width - 1))
            y1, y2 = int(max(py - 20, 1)), int(min(py + 20, height - 1))
            if (x2 - x1) < 1 or (y2 - y1) < 1:
                continue
            image[y1:y2, x1:x2] = cv2_linear_resize(template, x2 - x1, y2 - y1)
        grey = image.astype(np.uint8)
        frames.append(np.repeat(grey[None], 3, axis=0))
    return np.stack(frames)


def test_template_and_resize_match_framer_and_opencv():
    template = gaussian_template()
    assert np.array_equal(template, framer_template())
    # Numbers read off Framer's own function with OpenCV 4.10 (and 5.0): the template, its 40x40 blob
    # (what an interior point pastes) and a 13x7 box (a point near a corner).
    assert int(template.sum()) == 2435289 and template[0].nonzero()[0].tolist() == [100]
    assert template[100, 95:106].tolist() == [253, 253, 254, 254, 254, 255, 254, 254, 254, 253, 253]
    blob = resize_template(40, 40)
    assert int(blob.sum()) == 97463
    assert blob[20].tolist() == [
        12, 17, 22, 29, 38, 48, 60, 73, 89, 105, 123, 142, 162, 181, 199, 215, 230, 241, 249, 253,
        254, 250, 243, 232, 218, 202, 184, 166, 146, 127, 109, 92, 76, 62, 50, 39, 31, 23, 18, 13,
    ]  # fmt: skip
    assert resize_template(13, 7)[3].tolist() == [17, 39, 76, 128, 187, 235, 254, 237, 191, 132, 79, 40, 18]
    for w, h in [(40, 40), (13, 7), (1, 5), (29, 40), (40, 3)]:
        assert np.array_equal(resize_template(w, h), cv2_linear_resize(framer_template(), w, h)), (w, h)


def test_heatmap_equals_the_golden_array():
    # Interior, overlapping (the later point overwrites), near the edges (clipped boxes), invisible,
    # out of the frame (x = -1, x = 70 > width), and at the last pixel.
    xy = np.array(
        [
            [[10.0, 12.0], [30.5, 20.25], [70.0, 5.0], [40.0, 30.0]],
            [[2.0, 40.0], [31.0, 21.0], [-1.0, 10.0], [63.9, 47.9]],
        ],
        np.float32,
    )
    visible = np.array([[True, True, True, False], [True, True, True, True]])
    cond = heatmap_conditioning(xy, visible, 48, 64)
    golden = framer_heatmap(xy, visible, 48, 64)
    assert cond.shape == (2, 3, 48, 64) and cond.dtype == torch.float32
    assert np.array_equal(cond.numpy(), golden.astype(np.float32))
    # Framer's generate_gassian_heatmap on these tracks (run with OpenCV 4.10): frame sums, two rows.
    assert [int(cond[f].sum()) for f in range(2)] == [310380, 412731]
    assert cond[0, 0, 20, 25:36].tolist() == [216, 230, 241, 249, 254, 254, 251, 243, 232, 219, 203]
    assert cond[1, 0, 40, 0:6].tolist() == [0, 0, 6, 17, 26, 39]  # column 0 is never painted
    assert torch.equal(cond[:, 0], cond[:, 2]) and float(cond.max()) <= 255
    # No points (K = 0): all zeros, the same shape.
    assert not heatmap_conditioning(xy[:, :0], visible[:, :0], 48, 64).any()


# --- tracks through a clip ---------------------------------------------------------------------------


def _placement(box: CropBox, start: int, stride: int, frames: int, flipped: bool) -> ClipPlacement:
    return ClipPlacement(start, stride, frames, box, flipped)


def _square_centroid(frames: torch.Tensor) -> np.ndarray:
    """[T, 2]: the intensity centroid of each frame (channel 0), in pixel-centre coordinates."""
    weights = frames[:, 0].double()
    ys, xs = torch.meshgrid(torch.arange(weights.shape[1]), torch.arange(weights.shape[2]), indexing="ij")
    total = weights.sum(dim=(1, 2))
    return torch.stack(
        [(weights * xs).sum(dim=(1, 2)) / total, (weights * ys).sum(dim=(1, 2)) / total], -1
    ).numpy()


def _white_square_video(shape: MovingShape, frames: int) -> np.ndarray:
    video = np.zeros((frames, shape.height, shape.width, 3), np.uint8)
    for t in range(frames):
        x, y = shape.corner(t)
        video[t, y : y + shape.size, x : x + shape.size] = 255
    return video


@pytest.mark.parametrize("flipped", [False, True])
def test_tracks_follow_stride_crop_and_flip_exactly(flipped):
    shape = MovingShape.from_seed(96, 64, seed=3)  # 96x64 -> 64x64: a crop, no resize
    video = np.stack([shape.render(t) for t in range(24)])
    start, stride, num = 3, 4, 5
    torch.manual_seed(1)
    box = crop_box(64, 96, 64, 64, random_crop=True)
    assert (box.new_h, box.new_w) == (64, 96)
    clip = apply_crop_box(video[start : start + stride * num : stride], box)
    clip = clip.flip(-1) if flipped else clip
    xy, visible = clip_tracks(analytic_tracks(shape, 24), _placement(box, start, stride, num, flipped))
    color = torch.tensor(shape.color, dtype=torch.float32).view(1, 3, 1, 1) / 255
    mask = (clip - color).abs().amax(dim=1, keepdim=True) < 1e-6  # the square's exact colour
    checked = 0
    for t in range(num):
        ys, xs = torch.nonzero(mask[t, 0], as_tuple=True)
        if visible[t, 0] and len(xs) == shape.size**2:  # wholly in the crop: its centre is the track
            centre = [xs.double().mean().item(), ys.double().mean().item()]
            assert xy[t, 0].tolist() == pytest.approx(centre)
            checked += 1
        elif not visible[t, 0]:
            assert not (0 <= xy[t, 0, 0] < 64)
    assert checked >= 3
    # Every visible on-square point lies on a square pixel; none off it.
    for t in range(num):
        for p in range(5):
            if visible[t, p]:
                x, y = xy[t, p]
                assert mask[t, 0, round(float(y)), round(float(x))]


def test_tracks_follow_a_resize():
    # 96x80 -> 64x64: scaled by 0.8 (antialiased bilinear, as the loader does), then cropped.
    shape = MovingShape.from_seed(96, 80, seed=5)
    video = _white_square_video(shape, 12)
    box = crop_box(80, 96, 64, 64, random_crop=False)
    assert (box.new_h, box.new_w, box.left) == (64, 77, 6)
    clip = apply_crop_box(video[0:12:2], box)
    xy, visible = clip_tracks(analytic_tracks(shape, 12), _placement(box, 0, 2, 6, False))
    centroid = _square_centroid(clip)
    checked = 0
    for t in range(6):
        x, y = xy[t, 0]
        half = shape.size * 0.8 / 2 + 2
        if visible[t, 0] and half <= x < 64 - half and half <= y < 64 - half:  # wholly inside the crop
            assert centroid[t] == pytest.approx([x, y], abs=0.05)
            checked += 1
    assert checked >= 3


def test_points_leaving_the_frame_become_invisible():
    tracks = Tracks(
        np.array([[[5.0, 5.0], [90.0, 10.0], [50.0, 70.0]]] * 3, np.float32),
        np.array([[True, True, True], [True, False, True], [True, True, True]]),
        height=80,
        width=96,
    )
    box = CropBox(80, 96, 80, 96, top=8, left=16, height=64, width=64)  # crop only
    xy, visible = clip_tracks(tracks, _placement(box, 0, 1, 3, False))
    assert xy[0].tolist() == [[-11.0, -3.0], [74.0, 2.0], [34.0, 62.0]]
    assert visible.tolist() == [[False, False, True], [False, False, True], [False, False, True]]
    # The static background points of a synthetic clip are invisible while the square covers them.
    analytic = analytic_tracks(MovingShape.from_seed(96, 80, seed=0), 24)
    hidden = ~analytic.visible[:, 5:]
    assert hidden.any() and analytic.visible[:, :5].all()


# --- point selection -------------------------------------------------------------------------------


def _moving_and_static(frames: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """4 moving points (0..3) and 6 static ones (4..9), all visible."""
    xy = np.zeros((frames, 10, 2), np.float32)
    xy[:, :, 0] = np.arange(10) * 5.0
    xy[:, :4, 1] = np.arange(frames)[:, None] * 3.0
    return xy, np.ones((frames, 10), bool)


def test_selection_is_deterministic_with_dropout_at_the_configured_rate():
    xy, visible = _moving_and_static()
    options = PointSelection(min_points=1, max_points=3, dropout=0.3, moving_bias=0.5)
    assert np.array_equal(select_points(xy, visible, options, 7), select_points(xy, visible, options, 7))
    counts = [len(select_points(xy, visible, options, seed)) for seed in range(3000)]
    assert abs(counts.count(0) / 3000 - 0.3) < 0.03
    assert set(counts) == {0, 1, 2, 3}
    never = PointSelection(min_points=2, max_points=2, dropout=0.0, moving_bias=0.0)
    assert all(len(select_points(xy, visible, never, seed)) == 2 for seed in range(200))
    # Only points visible in the first frame are candidates.
    late = visible.copy()
    late[0, 1:] = False
    assert all(select_points(xy, late, never, s).tolist() in ([0], []) for s in range(50))


def test_selection_prefers_moving_points():
    xy, visible = _moving_and_static()

    def moving_share(bias: float) -> float:
        options = PointSelection(min_points=2, max_points=2, dropout=0.0, moving_bias=bias)
        picks = np.concatenate([select_points(xy, visible, options, seed) for seed in range(1000)])
        return float((picks < 4).mean())

    assert moving_share(1.0) == 1.0  # static points only after every moving one
    assert abs(moving_share(0.0) - 0.4) < 0.05  # uniform: 4 of 10
    assert 0.4 < moving_share(0.5) < 1.0


def test_motion_counts_only_steps_between_visible_positions():
    """A tracker's positions of an occluded point are guesses: a static point whose hidden positions
    jump is still static, and is not preferred over a point that really moves."""
    xy = np.zeros((5, 2, 2), np.float32)
    xy[:, 0, 0] = [0.0, 40.0, -30.0, 0.0, 0.0]  # point 0: static, garbage while hidden in frames 1-2
    xy[:, 1, 0] = np.arange(5) * 2.0  # point 1: moves 2 px per frame
    visible = np.ones((5, 2), bool)
    visible[1:3, 0] = False
    assert point_motion(xy, visible).tolist() == [0.0, 2.0]
    assert point_motion(xy)[0] > 2  # counting the hidden positions made the static point the "mover"
    always_hidden = np.array([[True, False]] + [[False, False]] * 4)
    assert point_motion(xy, always_hidden).tolist() == [0.0, 0.0]
    options = PointSelection(min_points=1, max_points=1, dropout=0.0, moving_bias=1.0)
    assert all(select_points(xy, visible, options, seed).tolist() == [1] for seed in range(50))


# --- trackers, the store, the command, the items ---------------------------------------------------


def test_data_tracks_command_writes_then_reuses(tmp_path, capsys, monkeypatch):
    from framer_ds.cli.main import main

    args = [
        "data",
        "tracks",
        str(FRAMER_TINY),
        f"output_dir={tmp_path / 'run'}",
        f"data.tracks.dir={tmp_path / 'tr'}",
    ]
    assert main(args) == 0
    assert "(8 tracked, 0 reused)" in capsys.readouterr().out
    files = sorted((tmp_path / "tr" / "analytic-v2").glob("clip_*.npz"))
    assert len(files) == 8
    (loaded,) = VideoTracks.load(files[0]).segments
    assert loaded.xy.shape == (24, 14, 2) and loaded.visible.shape == (24, 14) and loaded.first_frame == 0
    assert main(args) == 0
    assert "(0 tracked, 8 reused)" in capsys.readouterr().out
    # Started on N processes (`accelerate launch -m framer_ds data tracks ...`), each tracks its share.
    shared = [*args[:-1], f"data.tracks.dir={tmp_path / 'sharded'}"]
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(shared) == 0
        assert f"rank {rank} of 2: 4 videos" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "sharded" / "analytic-v2").glob("*.npz")) == [
        f.name for f in files
    ]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    bad = [*args, "data.tracks.tracker=cotracker"]
    assert main(bad) == 1
    assert "cotracker_checkpoint" in capsys.readouterr().err


def _tiny_task(tmp_path, *overrides):
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    config = load_run_config(
        FRAMER_TINY, [f"output_dir={tmp_path / 'run'}", f"data.tracks.dir={tmp_path / 'tr'}", *overrides]
    )
    return get_task_class(config.task)(config)


def test_items_carry_controlnet_cond_and_the_cache_gives_the_same(tmp_path):
    task = _tiny_task(
        tmp_path, "data.tracks.dropout=0.0", "data.tracks.min_points=2", "data.random_crop=true"
    )
    task.prepare_data()
    train, val = task.build_datasets()
    torch.manual_seed(0)
    item = train[1]
    cond = item["controlnet_cond"]
    assert cond.shape == (4, 3, 64, 64) and cond.dtype == torch.float32
    assert torch.equal(cond, cond.round()) and float(cond.min()) >= 0 and float(cond.max()) <= 255
    assert torch.equal(cond[:, 0], cond[:, 1]) and cond.amax(dim=(1, 2, 3)).gt(0).all()
    assert val is not None and val[0]["controlnet_cond"].shape == (4, 3, 64, 64)
    # The placement an item records is the one its pixels went through (read, crop, flip).
    record = next(r for r in train.records if r.video_id == item["video_id"])
    placement = ClipPlacement.from_json(item["placement"])
    frames = read_clip(record.path, placement.start, placement.num_frames, placement.stride)
    pixels = apply_crop_box(frames, placement.box).mul(2).sub(1)
    assert torch.equal(item["pixel_values"], pixels.flip(-1) if placement.flipped else pixels)
    batch = default_collate([train[0], train[2]])  # what the model side reads: batch["controlnet_cond"]
    assert batch["controlnet_cond"].shape == (2, 4, 3, 64, 64) and len(batch["placement"]) == 2

    # A cached entry stores the placement (as task._cached does); the tensor is rebuilt at load.
    cache = LatentCache(tmp_path / "cache", "k", 2)
    entries = []
    for i in range(2):
        torch.manual_seed(10 + i)
        entries.append(train[i])
        cache.write_entry(
            i, {"target": torch.zeros(1)}, {k: entries[i][k] for k in ("video_id", "placement")}
        )
    cache.mark_complete()
    cached = TrackConditionedDataset(
        CachedEntryDataset(cache), train.store, [*train.records, *val.records], train.selection, train.seed
    )
    for i in range(2):
        assert torch.equal(cached[i]["controlnet_cond"], entries[i]["controlnet_cond"])


def test_a_cached_run_and_an_uncached_run_give_the_same_controlnet_cond(tmp_path):
    from accelerate import Accelerator

    from framer_ds.data.item_draws import drawn_at_epoch

    task = _tiny_task(tmp_path, "data.cache.enabled=true", f"data.cache.dir={tmp_path / 'latents'}")
    task.prepare_data()
    train, val = task.build_datasets()
    task.setup_frozen(Accelerator(cpu=True))
    cached_train, cached_val = task.precompute(task.accelerator, train, val)
    assert isinstance(cached_train, TrackConditionedDataset)
    for entry in range(len(cached_train)):
        with drawn_at_epoch(train, entry // len(train)):  # copy k of a clip: the draw of epoch k
            uncached = train[entry % len(train)]
        cached = cached_train[entry]
        assert "target" in cached and cached["placement"] == uncached["placement"]
        assert torch.equal(cached["controlnet_cond"], uncached["controlnet_cond"])
    assert torch.equal(cached_val[0]["controlnet_cond"], val[0]["controlnet_cond"])


def test_tracks_on_an_svd_base_are_refused_as_unused(tmp_path):
    """Nothing reads `controlnet_cond` without Framer's ControlNet: a data.tracks on model.base svd is a
    config problem, not hours of tracking for nothing."""
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.video_lora.task import VideoLoraTask

    tiny = FRAMER_TINY.with_name("tiny.yaml")
    config = load_run_config(tiny, [f"output_dir={tmp_path / 'run'}", "data.tracks.tracker=analytic"])
    problems = {p.where: p.message for p in VideoLoraTask(config).check()}
    assert "model.base.name framer" in problems["data.tracks"]
