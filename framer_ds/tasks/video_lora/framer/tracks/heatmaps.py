"""Point trajectories -> Framer's ControlNet conditioning: which points, and the Gaussian heatmaps.

The `controlnet_cond` contract (what a training item carries when `data.tracks` is set):

- key `"controlnet_cond"`, float32 `[F, 3, H, W]` per item (`[B, F, 3, H, W]` batched), F = the
  clip's frames, H x W = the training size in PIXELS (the ControlNet's conditioning embedding
  downsamples by 8 itself);
- values are the integers 0..255 stored as float (NOT rescaled to [0, 1] or [-1, 1]): Framer's
  pipeline casts the uint8 heatmap to the UNet's dtype and feeds it as is; 0..255 is exact in fp16 and
  bf16;
- the three channels are equal (a grey image turned RGB); frame f holds every selected point visible
  in frame f as a 40 x 40 Gaussian blob pasted over whatever is there (later points overwrite
  earlier ones, no sum or max), clipped to the frame, never touching row/column 0 or the last
  row/column;
- invisible or out-of-frame points leave no blob in that frame; K = 0 (trajectory dropout, or no
  visible point) is all zeros.

Verified against Framer's code (aim-uofa/Framer at d0ba81f): `models_diffusers/utils.py`
`gen_gaussian_heatmap` (lines 15-32: a 200 x 200 isotropic Gaussian with sigma 40, masked by a
filled `cv2.circle` of radius 100, normalised to uint8 255), `draw_heatmap` (lines 35-50: the box
`max(c - 20, 1) .. min(c + 20, size - 1)`, truncated to int, `cv2.resize` of the template to the box,
assignment) and `generate_gassian_heatmap` (lines 53-85: points outside the frame or not visible are
skipped, `cv2.COLOR_GRAY2RGB`, `[F, 3, H, W]` uint8), called from
`pipelines/pipeline_stable_video_diffusion_interp_control.py` lines 474-479 at the video's pixel size
and cast to the UNet dtype. With no points Framer's pipeline does not run the ControlNet at all
(`with_control=False`, `app.py` lines 480-482); a training item cannot be "absent", so K = 0 is the
all-zero tensor `generate_gassian_heatmap` returns for zero points.

cv2 is not a dependency: the filled circle (cv2's midpoint `Circle` with LINE_8) and the uint8 bilinear
resize (11-bit fixed-point coefficients, as `cv2.resize(..., INTER_LINEAR)`) are re-implemented here
and checked against OpenCV for every box size a blob can take (docs/video_lora.md, "Trajectories").
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import Dataset

from framer_ds.config.errors import InputDataError
from framer_ds.tasks.video_lora.framer.tracks.point_tracks import TrackStore, VideoTracks, clip_tracks
from framer_ds.tasks.video_lora.shared.data.video_clips import ClipPlacement
from framer_ds.tasks.video_lora.shared.data.video_index import VideoRecord
from framer_ds.tasks.video_lora.shared.data.wrapped_dataset import ForwardsToWrapped

TEMPLATE_SIZE = 200  # Framer's gen_gaussian_heatmap(imgSize=200)
TEMPLATE_SIGMA = 40.0  # the `40 ** 2` in its formula
FRAMER_SIDE = 20  # generate_gassian_heatmap(side=20): a blob spans 2 * side pixels
_COEF_BITS = 11  # cv2's INTER_RESIZE_COEF_BITS
_COEF_SCALE = 1 << _COEF_BITS


def filled_circle_mask(size: int, cx: int, cy: int, radius: int) -> np.ndarray:
    """bool [size, size]: the pixels `cv2.circle(img, (cx, cy), radius, 1, -1)` sets (LINE_8, no shift):
    cv2's integer midpoint walk, each step filling the four horizontal spans it reaches."""
    mask = np.zeros((size, size), dtype=bool)

    def span(y: int, x_lo: int, x_hi: int) -> None:
        if 0 <= y < size:
            mask[y, max(x_lo, 0) : min(x_hi, size - 1) + 1] = True

    err, dx, dy, plus, minus = 0, radius, 0, 1, 2 * radius - 1
    while dx >= dy:
        span(cy - dy, cx - dx, cx + dx)
        span(cy + dy, cx - dx, cx + dx)
        span(cy - dx, cx - dy, cx + dy)
        span(cy + dx, cx - dy, cx + dy)
        dy += 1
        err += plus
        plus += 2
        if err > 0:
            err -= minus
            dx -= 1
            minus -= 2
    return mask


@lru_cache(maxsize=4)
def gaussian_template(size: int = TEMPLATE_SIZE, sigma: float = TEMPLATE_SIGMA) -> np.ndarray:
    """uint8 [size, size]: Framer's blob, computed in the same precision steps (float64 density stored
    as float32, circle mask, two float32 normalisations, truncation to uint8)."""
    grid = np.arange(size, dtype=np.float64) - size / 2
    exponent = -1 / 2 * (grid[:, None] ** 2 / sigma**2 + grid[None, :] ** 2 / sigma**2)
    density = (1 / 2 / np.pi / sigma**2 * np.exp(exponent)).astype(np.float32)
    density = density * filled_circle_mask(size, size // 2, size // 2, size // 2).astype(np.float32)
    density = (density / np.max(density)).astype(np.float32)
    template = (density / np.max(density) * 255).astype(np.uint8)
    template.setflags(write=False)
    return template


def _linear_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output position: the left source index and the 11-bit weights of it and its right neighbour,
    with cv2's half-pixel centres and edge clamping; the fraction is single precision and each weight
    is rounded on its own (half to even), as in cv2."""
    scale = 1.0 / (dst / src)
    pos = ((np.arange(dst, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    left = np.floor(pos).astype(np.int64)
    frac = (pos - left.astype(np.float32)).astype(np.float32)
    clamp = (left < 0) | (left >= src - 1)
    frac[clamp] = 0
    left = np.clip(left, 0, src - 1)
    w_left = np.round((np.float32(1) - frac) * np.float32(_COEF_SCALE)).astype(np.int64)
    w_right = np.round(frac * np.float32(_COEF_SCALE)).astype(np.int64)
    return left, w_left, w_right


@lru_cache(maxsize=256)
def resize_template(width: int, height: int) -> np.ndarray:
    """uint8 [height, width]: `cv2.resize(gaussian_template(), (width, height))` (INTER_LINEAR), equal
    to OpenCV 4.10 and 5.0 for every size 1..60 x 1..60 (a blob's box is at most 40 x 40)."""
    template = gaussian_template().astype(np.int64)
    src_h, src_w = template.shape
    if (width, height) == (src_w, src_h):
        return gaussian_template()
    xl, xa, xb = _linear_taps(src_w, width)
    yl, ya, yb = _linear_taps(src_h, height)
    xr, yr = np.minimum(xl + 1, src_w - 1), np.minimum(yl + 1, src_h - 1)
    rows = template[:, xl] * xa + template[:, xr] * xb  # [src_h, width], scaled by 2^11
    # cv2's vectorised vertical pass (VResizeLinearVec_32s8u), which OpenCV 4.10 and 5.0 use for every
    # column: rows drop 4 bits, each weighted row keeps the high 16 bits, then a rounded shift by 2.
    top = ((rows[yl] >> 4) * ya[:, None]) >> 16
    bottom = ((rows[yr] >> 4) * yb[:, None]) >> 16
    out = np.clip((top + bottom + 2) >> 2, 0, 255).astype(np.uint8)
    out.setflags(write=False)
    return out


def rasterise_tracks(
    xy: np.ndarray,
    visible: np.ndarray | None,
    height: int,
    width: int,
    side: int = FRAMER_SIDE,
    dtype: torch.dtype | None = None,
) -> np.ndarray:
    """uint8 [F, height, width]: Framer's `generate_gassian_heatmap` for tracks `xy` [F, P, 2] (x, y in
    pixels of this frame size, pixel centres at integers) and `visible` [F, P] (None = all).

    `dtype`: the dtype Framer's pipeline holds the tracks in (its demo passes them in the UNet's, fp16):
    the coordinates and the box edges `c - side`, `c + side` are then rounded in it, as Framer's tensor
    arithmetic rounds them (an fp16 `c + 20` can round up across an integer, widening the box by a
    pixel); None: exact (float64), the training path."""
    if dtype is None:
        xy = np.asarray(xy, dtype=np.float64)
        low, high = xy - side, xy + side
    else:
        held = torch.from_numpy(np.asarray(xy, dtype=np.float64)).to(dtype)
        xy, low, high = (v.to(torch.float64).numpy() for v in (held, held - side, held + side))
    frames = np.zeros((xy.shape[0], height, width), dtype=np.uint8)
    for f in range(xy.shape[0]):
        for p in range(xy.shape[1]):
            px, py = float(xy[f, p, 0]), float(xy[f, p, 1])
            if not (0 <= px < width and 0 <= py < height):
                continue
            if visible is not None and not visible[f, p]:
                continue
            x1, x2 = int(max(low[f, p, 0], 1)), int(min(high[f, p, 0], width - 1))
            y1, y2 = int(max(low[f, p, 1], 1)), int(min(high[f, p, 1], height - 1))
            if x2 - x1 < 1 or y2 - y1 < 1:
                continue
            frames[f, y1:y2, x1:x2] = resize_template(x2 - x1, y2 - y1)
    return frames


def heatmap_conditioning(
    xy: np.ndarray,
    visible: np.ndarray | None,
    height: int,
    width: int,
    side: int = FRAMER_SIDE,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """float32 [F, 3, height, width] in 0..255: the `controlnet_cond` of one item (module docstring);
    `dtype` as in `rasterise_tracks`."""
    grey = torch.from_numpy(rasterise_tracks(xy, visible, height, width, side, dtype))
    return grey.unsqueeze(1).expand(-1, 3, -1, -1).to(torch.float32)


@dataclass(frozen=True)
class PointSelection:
    """How many trajectories condition a clip and how they are drawn."""

    min_points: int
    max_points: int
    dropout: float  # P(K = 0)
    moving_bias: float  # 0: uniform over candidates; 1: chance proportional to motion


def point_motion(xy: np.ndarray, visible: np.ndarray | None = None) -> np.ndarray:
    """[P]: each point's mean distance moved per frame over the clip, the motion measure of the
    `sample_trajectories` that Framer's pipeline once imported with its heatmap function (commented
    out, pipeline line 35): it draws points with probability motion / max motion. With `visible` [F, P],
    only steps between two visible positions count (a tracker's positions of an occluded point are
    guesses, and a point that left the crop is not on screen to move); a point with no such step has 0."""
    if xy.shape[0] < 2:
        return np.zeros(xy.shape[1])
    steps = np.linalg.norm(np.diff(xy.astype(np.float64), axis=0), axis=-1)  # [F-1, P]
    if visible is None:
        return steps.mean(axis=0)
    seen = visible[1:] & visible[:-1]
    counted = seen.sum(axis=0)
    return np.where(counted > 0, (steps * seen).sum(axis=0) / np.maximum(counted, 1), 0.0)


def select_points(xy: np.ndarray, visible: np.ndarray, options: PointSelection, seed: int) -> np.ndarray:
    """Indices of the K trajectories that condition this clip: a pure function of the tracks and `seed`.

    Candidates are the points visible in the first frame (Framer's user clicks points on the first
    frame). With probability `dropout` K = 0 (the model must also work without trajectories);
    otherwise K ~ U[min_points, max_points], capped by the candidates. Points are drawn without
    replacement with weight (1 - b) + b * motion / max motion (b = moving_bias), by Efraimidis-Spirakis
    keys u^(1/w): a zero-weight (static) point comes only after every moving one."""
    rng = np.random.default_rng(seed)
    drop, count_draw, keys = rng.random(), rng.random(), rng.random(xy.shape[1])
    candidates = np.flatnonzero(visible[0])
    if drop < options.dropout or candidates.size == 0:
        return np.zeros(0, dtype=np.int64)
    span = options.max_points - options.min_points + 1
    k = min(options.min_points + int(count_draw * span), candidates.size)
    motion = point_motion(xy, visible)[candidates]
    top = motion.max()
    relative = motion / top if top > 0 else np.zeros_like(motion)
    weight = (1 - options.moving_bias) + options.moving_bias * relative
    with np.errstate(divide="ignore"):
        score = np.where(weight > 0, np.log(keys[candidates]) / np.maximum(weight, 1e-300), -math.inf)
    order = np.argsort(-score, kind="stable")
    return np.sort(candidates[order[:k]])


def selection_seed(seed: int, video_id: str, placement: ClipPlacement) -> int:
    """The points of a clip depend on the run's seed, the video and the clip's frames only: a cached
    clip and the same clip read from the video get the same points."""
    return zlib.crc32(f"{seed}|{video_id}|{placement.start}|{placement.stride}".encode())


class TrackConditionedDataset(ForwardsToWrapped, Dataset):
    """Adds `"controlnet_cond"` (module docstring) to each item of `base`, whose items carry "video_id"
    and "placement" (a `ClipPlacement` as JSON: `VideoClipDataset(with_placement=True)`, or a latent
    cache entry that stored it). The tensor is computed at load, from the video's track file, so a
    cached run and an uncached run give the same tensor for the same clip."""

    wrapped_attribute = "base"

    def __init__(
        self,
        base: Dataset,
        store: TrackStore,
        records: Iterable[VideoRecord],
        selection: PointSelection,
        seed: int,
        cached_videos: int = 64,
    ) -> None:
        self.base, self.store, self.selection, self.seed = base, store, selection, seed
        self._records = {record.video_id: record for record in records}
        self._tracks: OrderedDict[str, VideoTracks] = OrderedDict()  # a few videos' tracks, per process
        self._cached_videos = cached_videos

    def __len__(self) -> int:
        return len(self.base)

    @property
    def records(self) -> list[VideoRecord]:
        """The base dataset's records (what the latent cache fingerprints), else the tracked videos."""
        return list(getattr(self.base, "records", self._records.values()))

    def _tracks_of(self, video_id: str) -> VideoTracks:
        if video_id in self._tracks:
            self._tracks.move_to_end(video_id)
            return self._tracks[video_id]
        if video_id not in self._records:
            raise InputDataError(f"no video record for {video_id!r}; rebuild the latent cache.")
        tracks = self.store.load(self._records[video_id])
        self._tracks[video_id] = tracks
        if len(self._tracks) > self._cached_videos:
            self._tracks.popitem(last=False)
        return tracks

    def conditioning(self, video_id: str, placement: ClipPlacement) -> torch.Tensor:
        xy, visible = clip_tracks(self._tracks_of(video_id), placement)
        chosen = select_points(xy, visible, self.selection, selection_seed(self.seed, video_id, placement))
        box = placement.box
        return heatmap_conditioning(xy[:, chosen], visible[:, chosen], box.height, box.width)

    def __getitem__(self, index: int) -> dict:
        item = dict(self.base[index])
        if "placement" not in item:
            raise InputDataError(
                "a dataset item has no clip placement, so its point tracks cannot follow it: a latent "
                "cache built before data.tracks was set; it is rebuilt when the key changes."
            )
        placement = ClipPlacement.from_json(item["placement"])
        item["controlnet_cond"] = self.conditioning(item["video_id"], placement)
        return item
