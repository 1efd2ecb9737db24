"""`framer-ds sample --tracks T.json`: the point trajectories a user gives a Framer sample, turned into the
ControlNet's heatmaps exactly as Framer's demo (`app.py`, `Framer.run`) and pipeline do.

The file (docs/video_lora.md, "Framer"):

    {"size": [W, H],                                  # optional: the pixel frame of the coordinates
     "points": [[[x, y], [x, y], ...], ...],          # per point: its positions (keyframes)
     "visible": [[true, false, ...], ...]}            # optional, per point per frame

or Framer's own drag list, a bare `[[[x, y], ...], ...]`: the clicks of each drag in Framer's demo,
on the 512 x 320 image it shows (`app.py` `original_width, original_height = 512, 320`).

Framer's rules (aim-uofa/Framer at d0ba81f, `app.py`):
- coordinates are pixels, x right and y down; `size` defaults to the `--image`'s size (512 x 320 for a
  drag list). They follow the image: scaled to the image's own size when `size` differs, then through
  `--resize` exactly as `load_frame` frames the image (pixel centres map about the half-pixel grid, as
  `point_tracks.clip_tracks` maps training tracks);
- a point with `num_frames` positions is its track; any other count are keyframes spread evenly over
  the clip and interpolated by `scipy.interpolate.PchipInterpolator` after scaling (`interpolate_trajectory`,
  lines 94-111, called at lines 458-469); a single position is a point that stays, which Framer's demo
  turns into the keyframes (x, y), (x + 1, y + 1) (lines 463-465);
- the tracks [F, P, 2] go to the pipeline in the UNet's dtype (line 485: `.to(self.device, self.dtype)`,
  fp16): they are drawn with that dtype's rounding (`rasterise_tracks(dtype=...)`);
- they are drawn by `generate_gassian_heatmap` at the sampling size (pipeline lines 474-479), which
  `framer/tracks/heatmaps.heatmap_conditioning` reproduces; a point outside the frame leaves no blob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.tasks.video_lora.framer.tracks.heatmaps import heatmap_conditioning
from framer_ds.tasks.video_lora.shared.data.video_clips import crop_box

FRAMER_DEMO_SIZE = (512, 320)  # app.py: the (width, height) the demo shows and takes clicks on
TRACKS_KEYS = ("points", "size", "visible")


@dataclass(frozen=True)
class TrackFile:
    """A parsed tracks file: per point its positions [K_p, 2]; `size` (W, H) or None (the image's);
    `visible` [P, F] or None (all visible)."""

    points: list[np.ndarray]
    size: tuple[int, int] | None
    visible: np.ndarray | None


@dataclass(frozen=True)
class PixelMapping:
    """x' = (x + 0.5) * scale_x - 0.5 + offset_x (likewise y): pixel centres through a resize and a shift."""

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float

    def apply(self, xy: np.ndarray) -> np.ndarray:
        x = (xy[..., 0] + 0.5) * self.scale_x - 0.5 + self.offset_x
        y = (xy[..., 1] + 0.5) * self.scale_y - 0.5 + self.offset_y
        return np.stack([x, y], axis=-1)


def resize_mapping(src_w: int, src_h: int, width: int, height: int, resize: str) -> PixelMapping:
    """Where `load_frame` (shared/exports.py) puts a source pixel when it makes a src_w x src_h image
    width x height with this `--resize` mode ('crop': the training loader's centre crop box; 'stretch';
    'pad')."""
    if resize == "crop":
        box = crop_box(src_h, src_w, height, width, random_crop=False)
        return PixelMapping(box.new_w / src_w, box.new_h / src_h, -box.left, -box.top)
    if resize == "stretch":
        return PixelMapping(width / src_w, height / src_h, 0.0, 0.0)
    if resize == "pad":
        scale = min(height / src_h, width / src_w)
        new_h, new_w = max(1, round(src_h * scale)), max(1, round(src_w * scale))
        return PixelMapping(new_w / src_w, new_h / src_h, (width - new_w) // 2, (height - new_h) // 2)
    raise ValueError(f"unknown resize mode {resize!r}")


def _problem(path: Path, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(f"--tracks {path}", message)], "sample")


def _positions(path: Path, index: int, raw) -> np.ndarray:
    where = f"points[{index}]"
    if not isinstance(raw, list) or not raw:
        raise _problem(path, f"{where} must be a non-empty list of [x, y] positions, got {raw!r:.60}")
    for k, pair in enumerate(raw):
        ok = isinstance(pair, list) and len(pair) == 2
        if not ok or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair):
            raise _problem(path, f"{where}[{k}] must be [x, y] (two numbers, pixels), got {pair!r:.60}")
    xy = np.asarray(raw, dtype=np.float64)
    if not np.isfinite(xy).all():
        raise _problem(path, f"{where} holds a non-finite coordinate")
    return xy


def read_tracks_file(path: Path) -> TrackFile:
    """Parse and check a tracks file (module docstring); every error names the file and the problem."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise _problem(path, f"cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise _problem(path, f"not valid JSON ({exc})") from None
    if isinstance(raw, list):  # Framer's demo: a list of drags, clicks on its 512 x 320 image
        raw = {"points": raw, "size": list(FRAMER_DEMO_SIZE)}
    if not isinstance(raw, dict):
        raise _problem(path, 'must be an object {"points": [...], "size": [W, H]} or a list of drags')
    unknown = sorted(set(raw) - set(TRACKS_KEYS))
    if unknown:
        raise _problem(path, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(TRACKS_KEYS)}")
    if "points" not in raw:
        raise _problem(path, 'no "points": a list with, per point, its [x, y] positions')
    if not isinstance(raw["points"], list):
        raise _problem(path, '"points" must be a list with, per point, a list of [x, y] positions')
    points = [_positions(path, i, p) for i, p in enumerate(raw["points"])]
    size = raw.get("size")
    if size is not None:
        valid = isinstance(size, list) and len(size) == 2
        if not valid or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
            raise _problem(
                path, f'"size" must be [width, height] in pixels (positive integers), got {size!r}'
            )
        size = (size[0], size[1])
    visible = raw.get("visible")
    if visible is not None:
        shape_ok = isinstance(visible, list) and len(visible) == len(points)
        if not shape_ok or not all(
            isinstance(row, list) and len(row) == len(p) and all(isinstance(v, bool) for v in row)
            for row, p in zip(visible, points, strict=False)
        ):
            raise _problem(
                path,
                '"visible" must hold, per point, one true/false per position of that point '
                f"({len(points)} point(s))",
            )
        lengths = {len(p) for p in points}
        if len(lengths) > 1:
            raise _problem(
                path, '"visible" needs every point to have the same number of positions (one per frame)'
            )
        visible = np.asarray(visible, dtype=bool)
    return TrackFile(points, size, visible)


def framer_interpolate(keyframes: np.ndarray, num_frames: int) -> np.ndarray:
    """[K, 2] keyframes -> [num_frames, 2]: Framer's `interpolate_trajectory` (PCHIP in x and in y over
    keyframes at linspace(0, 1, K), sampled at linspace(0, 1, num_frames)); one keyframe is a point
    that stays, given Framer's (x + 1, y + 1) second keyframe."""
    from scipy.interpolate import PchipInterpolator

    if len(keyframes) == 1:
        keyframes = np.concatenate([keyframes, keyframes + 1.0])
    t = np.linspace(0, 1, len(keyframes))
    new_t = np.linspace(0, 1, num_frames)
    x = PchipInterpolator(t, keyframes[:, 0])(new_t)
    y = PchipInterpolator(t, keyframes[:, 1])(new_t)
    return np.stack([x, y], axis=-1)


def sampling_tracks(
    tracks: TrackFile,
    image_size: tuple[int, int],
    num_frames: int,
    height: int,
    width: int,
    resize: str,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(xy [F, P, 2] in the sampling frame's pixels, visible [F, P] or None) for an image of
    `image_size` (W, H) framed at width x height by `resize`. The visibility mask needs one position
    per frame: a tracks file that gives it with another count is an error."""
    src_w, src_h = tracks.size or image_size
    image_w, image_h = image_size
    to_image = PixelMapping(image_w / src_w, image_h / src_h, 0.0, 0.0)
    to_frame = resize_mapping(image_w, image_h, width, height, resize)
    if tracks.visible is not None and tracks.visible.shape[1] != num_frames:
        raise ConfigError(
            [
                ConfigProblem(
                    "--tracks",
                    f'"visible" gives {tracks.visible.shape[1]} frames, the sample has {num_frames}: with '
                    "visibility give one position per frame (or pass --num-frames)",
                )
            ],
            "sample",
        )
    per_point = []
    for keyframes in tracks.points:
        mapped = to_frame.apply(to_image.apply(keyframes))
        per_point.append(mapped if len(mapped) == num_frames else framer_interpolate(mapped, num_frames))
    if not per_point:
        return np.zeros((num_frames, 0, 2)), None
    xy = np.stack(per_point, axis=1)  # [F, P, 2]
    visible = None if tracks.visible is None else tracks.visible.T
    return xy, visible


def tracks_conditioning(
    path: Path,
    image_size: tuple[int, int],
    num_frames: int,
    height: int,
    width: int,
    resize: str,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """float32 [1, F, 3, height, width] heatmaps (0..255) from a tracks file: `controlnet_cond` for
    `sampling.FramerSampling`. The coordinates are drawn in `dtype`, as Framer's demo hands the
    pipeline its tracks in the UNet's dtype (`heatmaps.rasterise_tracks`). None for a file with
    no points: Framer's demo then runs without the ControlNet (`with_control = False`, app.py lines
    479-482)."""
    xy, visible = sampling_tracks(read_tracks_file(path), image_size, num_frames, height, width, resize)
    if xy.shape[1] == 0:
        return None
    return heatmap_conditioning(xy, visible, height, width, dtype=dtype)[None]
