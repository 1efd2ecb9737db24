"""Write frames to an mp4 with PyAV (the codec every PyAV wheel carries)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from framer_ds.compat import LazyModule
from framer_ds.storage.atomic import atomic_file

av = LazyModule("av", "writing mp4 videos (video samples)")


def to_uint8_frames(frames: torch.Tensor) -> np.ndarray:
    """[T,3,H,W] in [-1,1] -> uint8 [T,H,W,3], what `write_video` takes."""
    return ((frames.float() + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 1).cpu().numpy()


def write_video(path: Path, frames: Iterable[np.ndarray], fps: float, codec: str = "mpeg4") -> None:
    """`frames`: uint8 [H,W,3] arrays (H, W even: yuv420p). Atomic: a killed writer leaves no
    truncated mp4 where a reader (a cache, W&B, a user) would take it for a finished one."""
    frames = list(frames)
    height, width = frames[0].shape[:2]
    with atomic_file(path) as tmp, av.open(str(tmp), mode="w") as container:
        stream = container.add_stream(codec, rate=max(1, round(fps)))  # a slow clip plays at >= 1 fps
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for image in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
