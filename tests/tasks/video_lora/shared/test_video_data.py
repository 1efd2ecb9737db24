"""Video data layer: seeking clip reader vs a full decode, index/rejects/cache, manifests, datasets."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

from framer_ds.config.errors import ConfigError, InputDataError
from framer_ds.tasks.video_lora.shared.data import clip_reader
from framer_ds.tasks.video_lora.shared.data.clip_reader import VideoReadError, read_clip
from framer_ds.tasks.video_lora.shared.data.image_pairs import scan_image_pairs
from framer_ds.tasks.video_lora.shared.data.video_clips import (
    ClipSampler,
    ImagePairDataset,
    VideoClipDataset,
    resize_and_crop,
)
from framer_ds.tasks.video_lora.shared.data.video_index import (
    build_video_index,
    format_report,
    require_usable,
)
from framer_ds.tasks.video_lora.svd.preflight import validate_svd_size

W, H, CELL = 64, 48, 8  # an 8x6 grid of 8-pixel cells: frame i lights cell i, so 48 frames are unique


def encoder(*names: str) -> str:
    """The first of `names` this PyAV build can encode with."""
    for name in names:
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:
            continue
    pytest.skip(f"no encoder among {names} in this PyAV build")


def make_video(path: Path, n: int = 48, fps: int = 24, pts_offset: int = 0, codec: str | None = None) -> Path:
    """n frames, frame i showing a white square in grid cell i; GOP 12 with B-frames where the codec
    has them, so seeking lands mid-stream and the decoder reorders frames."""
    codec = codec or encoder("libx264", "mpeg4")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.codec_context.gop_size = 12
        options = {"libx264": {"bf": "2", "g": "12", "sc_threshold": "0"}, "mpeg4": {"bf": "2", "g": "12"}}
        stream.options = options.get(codec, {})  # a fixed GOP: no extra keyframes at "scene cuts"
        for i in range(n):
            array = np.full((H, W, 3), 30, dtype=np.uint8)
            row, col = divmod(i % 48, W // CELL)
            array[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL] = 255
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts, frame.time_base = i + pts_offset, Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def frame_number(frame: np.ndarray) -> int:
    """Which cell is lit: the frame index encoded by `make_video`."""
    cells = frame[..., 1].reshape(H // CELL, CELL, W // CELL, CELL).mean(axis=(1, 3))
    return int(cells.argmax())


def full_decode(path: Path) -> list[np.ndarray]:
    """The seed's way: every frame, in order."""
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    out = {
        "mp4": make_video(d / "a.mp4", pts_offset=7),  # non-zero start pts
        "mkv": make_video(d / "b.mkv", fps=30),  # no frame count in the container
        "avi": make_video(d / "c.avi", codec=encoder("mpeg4")),
        "short": make_video(d / "short.mp4", n=5),
    }
    if "libvpx" in av.codecs_available:
        out["webm"] = make_video(d / "d.webm", pts_offset=3, codec="libvpx")
    (d / "corrupt.mp4").write_bytes(b"\x00\x00\x00 ftypisom" + os.urandom(2000))
    out["corrupt"] = d / "corrupt.mp4"
    return out


def copy_tree(videos: dict[str, Path], dest: Path, names: list[str]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(videos[name], dest / videos[name].name)
    return dest


# --- read_clip ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mp4", "mkv", "avi", "webm"])
def test_read_clip_returns_exactly_the_full_decode_frames(videos: dict[str, Path], kind: str) -> None:
    if kind not in videos:
        pytest.skip("libvpx not in this PyAV build")
    full = full_decode(videos[kind])
    assert [frame_number(f) for f in full] == list(range(48))
    starts = range(48) if kind == "mp4" else range(0, 48, 5)
    for stride in (1, 2, 3):
        for start in (s for s in starts if s + 3 * stride < 48):
            clip = read_clip(videos[kind], start, 4, stride)
            assert clip.shape == (4, H, W, 3) and clip.dtype == np.uint8
            assert [frame_number(f) for f in clip] == [start + k * stride for k in range(4)]
            np.testing.assert_array_equal(clip, np.stack(full[start : start + 4 * stride : stride]))


def test_read_clip_decodes_only_from_the_keyframe_before(
    videos: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed decoded all 48 frames; a clip of frames 30..33 (keyframes every 12) needs 24..33."""
    decoded = []
    real_collect = clip_reader._collect

    def counting_collect(frames, wanted, index_of):
        def count():
            for frame in frames:
                decoded.append(index_of(frame))
                yield frame

        return real_collect(count(), wanted, index_of)

    monkeypatch.setattr(clip_reader, "_collect", counting_collect)
    with av.open(str(videos["mp4"])) as container:
        first_pts = next(container.decode(video=0)).pts
    clip = read_clip(videos["mp4"], 30, 4, 1, first_pts=first_pts)
    assert [frame_number(f) for f in clip] == [30, 31, 32, 33]
    # starts at keyframe 24, stops at 33; unreferenced frames before 29 may be skipped, not decoded
    assert decoded[0] == 24 and decoded[-1] == 33 and set(decoded) <= set(range(24, 34))


def test_read_clip_past_the_end_and_unreadable(videos: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(VideoReadError, match="the video ends at frame 47, the clip needs frame 50"):
        read_clip(videos["mp4"], 40, 6, 2)
    with pytest.raises(VideoReadError, match="cannot read"):
        read_clip(videos["corrupt"], 0, 2, 1)
    with pytest.raises(VideoReadError, match="cannot read"):
        read_clip(tmp_path / "gone.mp4", 0, 2, 1)


# --- index -------------------------------------------------------------------------------------------


def test_index_scans_recursively_and_rejects_with_reasons(videos: dict[str, Path], tmp_path: Path) -> None:
    root = copy_tree(videos, tmp_path / "ds", ["mp4", "short", "corrupt"])
    (root / "sub").mkdir()
    shutil.copy2(videos["mkv"], root / "sub" / "B.MKV")  # sub-directory, upper-case suffix
    (root / "notes.txt").write_text("not a video")
    index = build_video_index(root, None, min_frames=10, cache_dir=None)

    assert [r.video_id for r in index.records] == ["a.mp4", "sub/B.MKV"]
    a, b = index.records
    assert (a.num_frames, a.fps, a.width, a.height) == (48, 24.0, W, H)
    assert (b.num_frames, b.fps) == (48, 30.0)  # counted from the last packets, no frame count in mkv
    assert a.duration_s == pytest.approx(2.0)
    reasons = dict(index.rejected)
    assert reasons[root / "short.mp4"].startswith("too short: 5 frames, need 10")
    assert (
        "PyAV cannot read it" in reasons[root / "corrupt.mp4"]
        and "re-encode" in reasons[root / "corrupt.mp4"]
    )

    report = format_report(index)
    assert "usable: 2, rejected: 2" in report and "64x48 (2)" in report
    assert "24 (1)" in report and "30 (1)" in report
    assert f"rejected {root / 'short.mp4'}: too short" in report
    require_usable(index, "data.source.path")  # does not raise


def test_zero_usable_fails_with_the_report(videos: dict[str, Path], tmp_path: Path) -> None:
    root = copy_tree(videos, tmp_path / "ds", ["short", "corrupt"])
    index = build_video_index(root, None, min_frames=10, cache_dir=None)
    with pytest.raises(ConfigError) as err:
        require_usable(index, "data.source.path")
    text = str(err.value)
    assert "none of the 2 video file(s) is usable" in text and "usable: 0, rejected: 2" in text
    assert str(root / "corrupt.mp4") in text and "too short: 5 frames" in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no video files \(.avi, .mkv"):
        require_usable(build_video_index(tmp_path / "empty", None, 10, None), "data.source.path")
    with pytest.raises(ConfigError, match="does not exist"):
        build_video_index(tmp_path / "nope", None, 10, None)


def test_manifest_csv_segments_and_rejects(videos: dict[str, Path], tmp_path: Path) -> None:
    root = copy_tree(videos, tmp_path / "ds", ["mp4"])
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "path,start_frame,end_frame,fps,caption\n"
        "a.mp4,10,30,,a dog\n"
        f"{videos['mkv']},,,12.5,\n"  # absolute path; fps overrides only what the model sees
        "missing.mp4,,,,\n"
        "a.mp4,40,45,,\n"  # 5 frames < 10
        "a.mp4,0,60,,\n"  # past the end
    )
    index = build_video_index(root, manifest, min_frames=10, cache_dir=None)
    seg, mkv = index.records
    assert (seg.video_id, seg.first_frame, seg.stop_frame, seg.usable_frames) == ("a.mp4@10-30", 10, 30, 20)
    assert seg.caption == "a dog" and seg.source_fps == 24.0
    assert mkv.fps == 30.0 and mkv.source_fps == 12.5 and mkv.caption is None
    reasons = [reason for _, reason in index.rejected]
    assert reasons[0].startswith("file not found (listed on manifest line 4)")
    assert reasons[1].startswith("too short: 5 frames (frames 40..45 of 48), need 10")
    assert reasons[2] == "end_frame 60 is past the end of the video (48 frames); fix manifest line 6"

    ds = VideoClipDataset(index, num_frames=4, height=64, width=64, stride=3, train=False)
    clip = read_clip(seg.path, *ds.sampler.sample(seg)[:1], 4, 3)  # centred inside frames 10..30
    assert [frame_number(f) for f in clip] == [15, 18, 21, 24]


def test_manifest_jsonl_and_unknown_columns(videos: dict[str, Path], tmp_path: Path) -> None:
    root = copy_tree(videos, tmp_path / "ds", ["mp4"])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"path": "a.mp4", "start_frame": 2, "caption": "x"}) + "\n\n")
    (record,) = build_video_index(root, manifest, 10, None).records
    assert (record.first_frame, record.stop_frame, record.caption) == (2, 48, "x")

    manifest.write_text(json.dumps({"path": "a.mp4", "captoin": "x", "start_frame": -1}) + "\n")
    with pytest.raises(ConfigError) as err:
        build_video_index(root, manifest, 10, None)
    text = str(err.value)
    assert "unknown column 'captoin'. Did you mean 'caption'?" in text
    assert "start_frame=-1 must be an integer >= 0" in text and ":1:" in text
    bad_csv = tmp_path / "m.csv"
    bad_csv.write_text("file,caption\na.mp4,x\n")
    with pytest.raises(ConfigError, match="no 'path' column"):
        build_video_index(root, bad_csv, 10, None)


def test_index_cache_reused_and_invalidated(
    videos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_tree(videos, tmp_path / "ds", ["mp4", "short", "corrupt"])
    opened: list[str] = []
    real_open = av.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(av, "open", counting_open)
    cache = tmp_path / "cache"
    first = build_video_index(root, None, 10, cache)
    assert len(opened) == 3
    (cache_file,) = cache.iterdir()  # one JSON, no temp files left behind
    assert cache_file.suffix == ".json"

    opened.clear()
    second = build_video_index(root, None, 10, cache)
    assert opened == [] and second == first
    # min_frames is applied to cached probes, so a new clip length needs no re-probe either
    assert len(build_video_index(root, None, 5, cache).records) == 2 and opened == []

    shutil.copy2(videos["short"], root / "a.mp4")  # a.mp4 changes: size and mtime differ
    third = build_video_index(root, None, 10, cache)
    assert opened == [str(root / "a.mp4")]
    assert third.records == [] and len(third.rejected) == 3


def test_a_missing_pyav_raises_and_never_caches_good_videos_as_rejected(
    videos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI saw this: a run without PyAV (a fake `av` on PYTHONPATH) shared the index cache with later runs,
    which then rejected every good clip with "No module named av" until the cache was deleted."""
    from framer_ds.compat import MissingDependencyError
    from framer_ds.tasks.video_lora.shared.data import video_index

    root = copy_tree(videos, tmp_path / "ds", ["mp4"])
    cache = tmp_path / "cache"

    with monkeypatch.context() as patched:
        patched.setattr(video_index.av, "_module", "framer_ds_no_such_module_av")
        with pytest.raises(MissingDependencyError, match="is required for indexing videos"):
            build_video_index(root, None, 10, cache)
    assert not cache.exists() or not any(cache.iterdir())
    assert len(build_video_index(root, None, 10, cache).records) == 1


# --- image pairs, sizes, resize ------------------------------------------------------------------------


def write_image(path: Path, value: int, size: tuple[int, int] = (80, 60)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, value, value)).save(path)
    return path


def test_scan_image_pairs(tmp_path: Path) -> None:
    write_image(tmp_path / "a_start.png", 0)
    write_image(tmp_path / "a_end.jpg", 255)
    write_image(tmp_path / "sub" / "b_start.PNG", 0)
    write_image(tmp_path / "sub" / "b_end.webp", 255)
    (tmp_path / "readme_start.txt").write_text("ignored")
    pairs = scan_image_pairs(tmp_path)
    assert [(i, s.name, e.name) for i, s, e in pairs] == [
        ("a", "a_start.png", "a_end.jpg"),
        ("sub/b", "b_start.PNG", "b_end.webp"),
    ]
    ds = ImagePairDataset(pairs, height=64, width=64, num_frames=14)
    item = ds[0]
    assert item["pixel_values"].shape == (2, 3, 64, 64) and item["pixel_values"].dtype == torch.float32
    assert item["pixel_values"][0].max() == -1.0 and item["pixel_values"][1].min() == 1.0
    assert item["video_id"] == "a" and item["num_frames"] == 14

    write_image(tmp_path / "c_start.png", 0)
    with pytest.raises(ConfigError) as err:
        scan_image_pairs(tmp_path)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].where == str(tmp_path / "c_start.png")
    assert "no matching c_end" in str(err.value)


def test_validate_svd_size() -> None:
    assert validate_svd_size(576, 1024) == []
    problems = validate_svd_size(570, 32)
    assert [p.where for p in problems] == ["data.height", "data.width"]
    assert "570 is not a multiple of 64" in problems[0].message and "use 576" in problems[0].message
    assert "use 64" in problems[1].message
    # a dataset checks the size by its base family's rule (issue 47: Wan's 16, not SVD's 64 for all)
    with pytest.raises(ConfigError, match="multiple of 64"):
        VideoClipDataset(build_index_stub(), num_frames=2, height=100, width=64, size_multiple=64)
    VideoClipDataset(build_index_stub(), num_frames=2, height=80, width=112, size_multiple=16)


def build_index_stub():
    from framer_ds.tasks.video_lora.shared.data.video_index import VideoIndex, VideoRecord

    rec = VideoRecord(Path("x.mp4"), "x.mp4", 48, 24.0, W, H, 2.0)
    return VideoIndex(root=Path("."), min_frames=1, records=[rec])


def test_resize_and_crop() -> None:
    frames = np.zeros((2, 64, 128, 3), dtype=np.uint8)
    frames[:, :, 32:96] = 255  # the centre 64 columns are white
    out = resize_and_crop(frames, 64, 64, random_crop=False)
    assert out.shape == (2, 3, 64, 64) and out.dtype == torch.float32 and torch.all(out == 1.0)
    up = resize_and_crop(frames, 128, 128, random_crop=False)  # 2x up, antialiased
    assert up.shape == (2, 3, 128, 128) and up.min() >= 0.0 and up.max() <= 1.0
    torch.manual_seed(0)
    crops = {resize_and_crop(frames, 64, 64, random_crop=True)[0, 0, 0].sum().item() for _ in range(20)}
    assert len(crops) > 1


# --- datasets ----------------------------------------------------------------------------------------


@pytest.fixture()
def index(videos: dict[str, Path], tmp_path: Path):
    root = tmp_path / "ds"
    root.mkdir()
    for i in range(4):
        shutil.copy2(videos["mp4"], root / f"v{i}.mp4")
    return build_video_index(root, None, ClipSampler(4, stride_range=(1, 3)).min_frames, None)


def test_dataset_item_shapes_range_and_eval_determinism(index) -> None:
    ds = VideoClipDataset(index, num_frames=4, height=64, width=64, stride=2, train=False)
    state = torch.get_rng_state()
    item = ds[1]
    assert torch.equal(torch.get_rng_state(), state)  # eval consumes no randomness
    assert item["pixel_values"].shape == (4, 3, 64, 64) and item["pixel_values"].dtype == torch.float32
    assert item["pixel_values"].min() >= -1.0 and item["pixel_values"].max() <= 1.0
    assert item["pixel_values"].min() < -0.5 and item["pixel_values"].max() > 0.9
    assert item["video_id"] == "v1.mp4" and item["fps"] == 12.0
    assert torch.equal(ds[1]["pixel_values"], item["pixel_values"])
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=2)))
    assert batch["pixel_values"].shape == (2, 4, 3, 64, 64)


def test_sampling_deterministic_under_torch_seed(index) -> None:
    ds = VideoClipDataset(index, num_frames=4, height=64, width=64, stride_range=(1, 3), random_crop=True)
    torch.manual_seed(7)
    first = [ds[i % 4] for i in range(8)]
    torch.manual_seed(7)
    second = [ds[i % 4] for i in range(8)]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and a["fps"] == b["fps"]
    assert {item["fps"] for item in first} <= {24.0, 12.0, 8.0}
    sampler = ClipSampler(4, stride_range=(1, 3))
    assert sampler.min_frames == 10
    draws = {sampler.sample(index.records[0]) for _ in range(200)}
    assert all(start >= 0 and start + 3 * stride <= 47 for start, stride in draws)
    assert {stride for _, stride in draws} == {1, 2, 3} and len(draws) > 20
    with pytest.raises(ValueError, match="not both"):
        ClipSampler(4, stride=2, stride_range=(1, 3))


def test_seeded_items_draw_by_epoch_and_index_not_from_the_global_rng(index) -> None:
    """What a resumed run relies on (data/item_draws.py): an item's start, stride, crop and flip are a
    function of (seed, epoch, index), whenever it is read, and leave the training RNG alone."""
    ds = VideoClipDataset(
        index, num_frames=4, height=64, width=64, stride_range=(1, 3), random_crop=True, hflip=True,
        with_placement=True, seed=3,
    )  # fmt: skip
    state = torch.get_rng_state()
    placements = [ds[i]["placement"] for i in range(4)]
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)  # the global RNG plays no part
    assert [ds[i]["placement"] for i in range(4)] == placements
    ds.set_epoch(1)
    later = [ds[i]["placement"] for i in range(4)]
    assert later != placements  # a new epoch, new augmentation
    with ds.at_epoch(0):
        assert [ds[i]["placement"] for i in range(4)] == placements
    assert [ds[i]["placement"] for i in range(4)] == later


def test_hflip_mirrors_or_not(index) -> None:
    plain = VideoClipDataset(index, num_frames=2, height=64, width=64, stride=1)
    flip = VideoClipDataset(index, num_frames=2, height=64, width=64, stride=1, hflip=True)
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        reference = plain[0]["pixel_values"]
        torch.manual_seed(seed)  # same start draw; the flip draw comes after it
        out = flip[0]["pixel_values"]
        seen.add("same" if torch.equal(out, reference) else "mirrored")
        assert torch.equal(out, reference) or torch.equal(out, reference.flip(-1))
    assert seen == {"same", "mirrored"}


def test_deleted_file_does_not_crash_getitem(index, caplog: pytest.LogCaptureFixture) -> None:
    ds = VideoClipDataset(index, num_frames=4, height=64, width=64, stride=1, max_failed_fraction=0.25)
    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers get a pickled copy
    index.records[2].path.unlink()
    with caplog.at_level(logging.WARNING, logger="framer_ds.tasks.video_lora.shared.data.video_clips"):
        item = ds[2]
        again = ds[2]
    assert item["video_id"] != "v2.mp4" and item["pixel_values"].shape == (4, 3, 64, 64)
    assert again["video_id"] == item["video_id"]  # deterministic replacement
    assert ds.failures == 1 and list(ds.failed) == [str(index.records[2].path)]
    assert sum("skipping" in r.message for r in caplog.records) == 1  # warned once per file
    index.records[0].path.unlink()
    with pytest.raises(InputDataError) as err:
        clone[0]
        clone[2]
    assert "2 of 4 videos failed (limit 1)" in str(err.value)
    assert "v0.mp4" in str(err.value) and "v2.mp4" in str(err.value)
