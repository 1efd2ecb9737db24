"""Sample videos people can open: H.264 in yuv420p with the index first (+faststart), odd sizes padded
to even, a stated fallback where the encoder is missing, and the frames as lossless PNGs beside them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import framer_ds.tasks.video_lora.shared.data.video_write as video_write
from framer_ds.tasks.video_lora.shared.data.video_write import frames_dir, write_frame_pngs, write_video

av = pytest.importorskip("av")


def random_frames(count: int, height: int, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def probe(path) -> tuple[str, str, int, int, int]:
    """(codec, pix_fmt, width, height, decoded frames) as a player sees the file."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        decoded = list(container.decode(video=0))
        return context.name, context.pix_fmt, context.width, context.height, len(decoded)


def test_an_odd_sized_clip_is_written_as_h264_yuv420p_padded_to_even_with_the_index_first(tmp_path):
    path = tmp_path / "clip.mp4"
    assert write_video(path, random_frames(5, 33, 47), fps=8) == "libx264"
    assert probe(path) == ("h264", "yuv420p", 48, 34, 5)
    data = path.read_bytes()
    assert 0 <= data.find(b"moov") < data.find(b"mdat")  # +faststart: plays while it downloads
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # no temporary file left


def test_padding_repeats_the_edge_and_leaves_even_frames_alone():
    frame = np.arange(3 * 5 * 3, dtype=np.uint8).reshape(3, 5, 3)
    padded = video_write.even_frame(frame)
    assert padded.shape == (4, 6, 3)
    np.testing.assert_array_equal(padded[:3, :5], frame)
    np.testing.assert_array_equal(padded[3, :5], frame[2])
    np.testing.assert_array_equal(padded[:3, 5], frame[:, 4])
    even = np.zeros((4, 6, 3), dtype=np.uint8)
    assert video_write.even_frame(even) is even


def test_without_the_h264_encoder_it_falls_back_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(video_write, "missing_h264_reason", lambda: "this PyAV build has no libx264 encoder")
    path = tmp_path / "clip.mp4"
    with pytest.warns(UserWarning, match="no libx264 encoder.*pip install av"):
        assert write_video(path, random_frames(3, 16, 16), fps=4) == "mpeg4"
    assert probe(path)[:2] == ("mpeg4", "yuv420p")


def test_frames_are_written_as_lossless_pngs_beside_the_video(tmp_path):
    frames = random_frames(3, 33, 47)
    video = tmp_path / "sample.mp4"
    folder = write_frame_pngs(video, frames)
    assert folder == frames_dir(video) == tmp_path / "sample_frames"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["frame_000.png", "frame_001.png", "frame_002.png"]
    for name, frame in zip(names, frames, strict=True):
        with Image.open(folder / name) as image:
            np.testing.assert_array_equal(np.asarray(image), frame)  # PNG: exact, at the frame's own size
    write_frame_pngs(video, frames[:1])  # a new sample replaces the old frames whole
    assert sorted(p.name for p in folder.iterdir()) == ["frame_000.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample_frames"]
