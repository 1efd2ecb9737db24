"""Write frames to an mp4 people can open: H.264 (`libx264`, `yuv420p`, `+faststart`), the codec
browsers, W&B, TensorBoard and players decode; the PyAV wheel from PyPI carries it. A build without it
falls back to MPEG-4 Part 2 with a warning saying why, never silently. Sample videos also get their
frames as PNGs beside them (`write_frame_pngs`): people compare frames, and a PNG is lossless."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from framer_ds.compat import LazyModule
from framer_ds.storage.atomic import atomic_file, building_dir, publish_dir

av = LazyModule("av", "writing mp4 videos (video samples)")

H264, FALLBACK = "libx264", "mpeg4"


def to_uint8_frames(frames: torch.Tensor) -> np.ndarray:
    """[T,3,H,W] in [-1,1] -> uint8 [T,H,W,3], what `write_video` takes."""
    return ((frames.float() + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 1).cpu().numpy()


def even_frame(image: np.ndarray) -> np.ndarray:
    """[H,W,3] padded to an even height and width by repeating the last row / column: yuv420p keeps
    one chroma sample per 2x2 pixels, so H.264 encoders refuse odd sizes; nothing is cropped away."""
    pad = ((0, image.shape[0] % 2), (0, image.shape[1] % 2), (0, 0))
    return np.pad(image, pad, mode="edge") if any(p[1] for p in pad[:2]) else image


@functools.cache
def missing_h264_reason() -> str | None:
    """Why this PyAV cannot write H.264, or None when it can."""
    try:
        av.codec.Codec(H264, "w")
    except Exception as exc:  # av.codec.codec.UnknownCodecError, or an encoder the build disabled
        return f"this PyAV build ({av.__version__}) has no {H264} encoder ({exc})"
    return None


def write_video(path: Path, frames: Iterable[np.ndarray], fps: float) -> str:
    """`frames`: uint8 [H,W,3] arrays (odd sizes are padded to even). Returns the codec written: H.264,
    or MPEG-4 Part 2 with a warning where the encoder is missing. Atomic: a killed writer leaves no
    truncated mp4 where a reader (a cache, W&B, a user) would take it for a finished one."""
    frames = [even_frame(np.asarray(image)) for image in frames]
    height, width = frames[0].shape[:2]
    reason = missing_h264_reason()
    codec = H264 if reason is None else FALLBACK
    if reason is not None:
        warnings.warn(
            f"{path}: written as MPEG-4 Part 2, which browsers and W&B do not play: {reason}; install the "
            "PyAV wheel from PyPI (`pip install av`), which carries libx264",
            stacklevel=2,
        )
    # +faststart: the index (moov) goes first, so a browser plays the file while it downloads.
    with (
        atomic_file(path) as tmp,
        av.open(str(tmp), mode="w", options={"movflags": "+faststart"}) as container,
    ):
        stream = container.add_stream(codec, rate=max(1, round(fps)))  # a slow clip plays at >= 1 fps
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for image in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return codec


def frames_dir(video_path: Path) -> Path:
    """Where `write_frame_pngs` puts a video's frames: `clip.mp4` -> `clip_frames/`."""
    return Path(video_path).with_name(f"{Path(video_path).stem}_frames")


def write_frame_pngs(video_path: Path, frames: Iterable[np.ndarray]) -> Path:
    """Each uint8 [H,W,3] frame as `<stem>_frames/frame_000.png` beside the video, at its own size
    (not padded). The folder appears whole or not at all (built aside, then renamed in)."""
    target = frames_dir(video_path)
    with building_dir(target) as staging:
        for index, image in enumerate(frames):
            Image.fromarray(np.ascontiguousarray(image)).save(staging / f"frame_{index:03d}.png")
    publish_dir(staging, target)
    return target
