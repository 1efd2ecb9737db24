"""Small real mp4 clips of moving shapes, written with PyAV: data for the tiny video demo and tests.

A fresh checkout can run `framer-ds train configs/tasks/video_lora/tiny.yaml` with no download: the clips
are encoded once into the cache (atomically, so two ranks racing end up with one complete folder).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from framer_ds.data.video_write import write_video
from framer_ds.storage.atomic import building_dir, publish_dir

MARKER = ".complete"


def write_moving_shape_clip(path: Path, frames: int, width: int, height: int, fps: int, seed: int) -> None:
    """A coloured square crossing a gradient background: motion a video model can learn quickly."""
    rng = np.random.default_rng(seed)
    color = rng.integers(64, 256, size=3, dtype=np.uint8)
    size = max(8, min(width, height) // 4)
    x0, y0 = rng.integers(0, width - size), rng.integers(0, height - size)
    vx, vy = rng.choice([-3, -2, 2, 3]), rng.choice([-2, -1, 1, 2])
    ramp = np.linspace(0, 96, width, dtype=np.float32)[None, :, None]
    background = np.broadcast_to(ramp, (height, width, 3)).astype(np.uint8)

    def frame(t: int) -> np.ndarray:
        image = background.copy()
        x = int((x0 + vx * t) % (width - size))
        y = int((y0 + vy * t) % (height - size))
        image[y : y + size, x : x + size] = color
        return image

    write_video(path, (frame(t) for t in range(frames)), fps)


def ensure_synthetic_clips(
    target: Path, count: int = 8, frames: int = 24, width: int = 96, height: int = 80, fps: int = 12
) -> Path:
    """`count` clips in `target` (idempotent: a marker file says the folder is complete)."""
    target = Path(target)
    if (target / MARKER).is_file():
        return target
    with building_dir(target) as staging:
        for i in range(count):
            write_moving_shape_clip(staging / f"clip_{i:03d}.mp4", frames, width, height, fps, seed=i)
        (staging / MARKER).write_text(str(count))
    # Lost a race: fine when the winner's folder is complete; a half-written one is not ours to fix.
    if not publish_dir(staging, target, replace=False) and not (target / MARKER).is_file():
        raise FileExistsError(f"{target} exists but holds no complete clip set; remove it and run again")
    return target
