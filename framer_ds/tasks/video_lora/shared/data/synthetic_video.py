"""Small real mp4 clips of moving shapes, written with PyAV: data for the tiny video demo and tests.

A fresh checkout can run `framer-ds train configs/tasks/video_lora/tiny.yaml` with no download: the clips
are encoded once into the cache (atomically, so two ranks racing end up with one complete folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from framer_ds.storage.atomic import building_dir, publish_dir
from framer_ds.tasks.video_lora.shared.data.video_write import write_video

MARKER = ".complete"


@dataclass(frozen=True)
class MovingShape:
    """The square of one synthetic clip: where it is in every frame is known exactly, which gives the
    analytic point tracks (`framer_ds.tasks.video_lora.framer.tracks.point_tracks.AnalyticTracker`)."""

    color: np.ndarray
    size: int
    x0: int
    y0: int
    vx: int
    vy: int
    width: int
    height: int

    @classmethod
    def from_seed(cls, width: int, height: int, seed: int) -> MovingShape:
        # The draw order decides the videos already in users' caches: do not reorder.
        rng = np.random.default_rng(seed)
        color = rng.integers(64, 256, size=3, dtype=np.uint8)
        size = max(8, min(width, height) // 4)
        x0, y0 = rng.integers(0, width - size), rng.integers(0, height - size)
        vx, vy = rng.choice([-3, -2, 2, 3]), rng.choice([-2, -1, 1, 2])
        return cls(color, size, int(x0), int(y0), int(vx), int(vy), width, height)

    def corner(self, t: int) -> tuple[int, int]:
        """(x, y) of the square's top-left pixel in frame t (it wraps around at the edges)."""
        x = int((self.x0 + self.vx * t) % (self.width - self.size))
        y = int((self.y0 + self.vy * t) % (self.height - self.size))
        return x, y

    def render(self, t: int) -> np.ndarray:
        """uint8 [height, width, 3]: frame t, the square over a horizontal gradient."""
        ramp = np.linspace(0, 96, self.width, dtype=np.float32)[None, :, None]
        image = np.broadcast_to(ramp, (self.height, self.width, 3)).astype(np.uint8)
        x, y = self.corner(t)
        image[y : y + self.size, x : x + self.size] = self.color
        return image


def clip_seed(path: Path) -> int | None:
    """The seed of a clip `ensure_synthetic_clips` wrote (clip_003.mp4 -> 3), None for other files."""
    name = Path(path).name
    if name.startswith("clip_") and name.endswith(".mp4") and name[5:-4].isdigit():
        return int(name[5:-4])
    return None


def write_moving_shape_clip(path: Path, frames: int, width: int, height: int, fps: int, seed: int) -> None:
    """A coloured square crossing a gradient background: motion a video model can learn quickly."""
    shape = MovingShape.from_seed(width, height, seed)
    write_video(path, (shape.render(t) for t in range(frames)), fps)


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
