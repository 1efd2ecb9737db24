"""A generated multi-camera driving set: roads with lane markings seen from three offset cameras over a
few frames of ego motion, with drivable-space masks. Data for the `drivable_vit` CPU demo and tests.

Why rendered geometry instead of random blobs: the cameras look at one world (a curved road on a ground
plane) from different yaws and positions, and the frames follow the car along the road, so the views and
frames share real structure for the cross-view and temporal stages to use, and a small model can learn
the masks measurably better than predicting all road or all background. Deterministic from a seed: every
rank and every machine writes the same bytes.

Layout (what `multiview_manifest` reads): `manifest.jsonl` with one sample a line,
`images/<id>/<view>_<t>.png`, `masks/<id>/<view>_<t>.png` (0/255), ego motion [T, 9] inline.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from framer_ds.storage.atomic import build_once

MARKER = ".framer_synthetic_roads_complete"
VIEWS = ("left", "center", "right")
CAMERA_YAW = {"left": -0.75, "center": 0.0, "right": 0.75}  # radians
CAMERA_SHIFT = {"left": -0.6, "center": 0.0, "right": 0.6}  # metres, across the car
CAMERA_HEIGHT = 1.5
FIELD_OF_VIEW = math.radians(80)
FRAME_SECONDS = 0.5
EGO_MOTION_FIELDS = ("x", "y", "z", "roll", "pitch", "yaw", "vx", "vy", "vz")
"""Per frame: the ego pose relative to the last frame (x across, y up, z ahead; angles in radians), then
the velocity in the ego frame (m/s). The generator moves in the ground plane: y, roll, pitch, vy are 0."""

GROUND_COLOURS = np.array([[70, 110, 50], [110, 90, 60], [150, 140, 100], [60, 90, 70]], dtype=np.float32)


@dataclass(frozen=True)
class RoadSetOptions:
    train_samples: int = 96
    eval_samples: int = 20
    frames: int = 3
    image_size: int = 64
    seed: int = 0

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Road:
    """A road in world coordinates (x across, z ahead): centre x = amplitude * sin(z / wavelength +
    phase) + drift * z, half width `half_width`; a dashed centre line and solid edge lines."""

    amplitude: float
    wavelength: float
    phase: float
    drift: float
    half_width: float

    def centre(self, z: np.ndarray) -> np.ndarray:
        return self.amplitude * np.sin(z / self.wavelength + self.phase) + self.drift * z

    def heading(self, z: float) -> float:
        slope = self.amplitude / self.wavelength * math.cos(z / self.wavelength + self.phase) + self.drift
        return math.atan(slope)


def random_road(rng: np.random.Generator) -> Road:
    return Road(
        amplitude=float(rng.uniform(0.5, 4.0)),
        wavelength=float(rng.uniform(6.0, 18.0)),
        phase=float(rng.uniform(0, 2 * math.pi)),
        drift=float(rng.uniform(-0.15, 0.15)),
        half_width=float(rng.uniform(2.0, 4.0)),
    )


def render_view(
    road: Road, ego: tuple[float, float, float], view: str, size: int, look: dict, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 [size, size, 3], mask bool [size, size]) of one camera at ego pose (x, z, yaw)."""
    focal = size / 2 / math.tan(FIELD_OF_VIEW / 2)
    centre = (size - 1) / 2
    horizon = look["horizon"] * size
    v, u = np.mgrid[0:size, 0:size].astype(np.float64)
    below = v > horizon + 0.5
    depth = np.where(below, CAMERA_HEIGHT * focal / np.maximum(v - horizon, 1e-6), 0.0)
    across = depth * (u - centre) / focal
    yaw = ego[2] + CAMERA_YAW[view]
    shift = CAMERA_SHIFT[view]
    world_x = ego[0] + shift * math.cos(ego[2]) + across * math.cos(yaw) + depth * math.sin(yaw)
    world_z = ego[1] - shift * math.sin(ego[2]) - across * math.sin(yaw) + depth * math.cos(yaw)
    offset = np.abs(world_x - road.centre(world_z))
    near = below & (depth < 60.0)
    road_mask = near & (offset < road.half_width)
    dashes = (offset < 0.12) & (np.mod(world_z, 4.0) < 2.0)
    edges = np.abs(offset - (road.half_width - 0.2)) < 0.1
    image = np.empty((size, size, 3), dtype=np.float32)
    sky_shade = np.clip(1.0 - v / max(horizon, 1.0) * 0.3, 0.6, 1.0)[..., None]
    image[:] = look["sky"] * sky_shade
    texture = rng.normal(0, look["texture"], (size, size, 1)).astype(np.float32)
    blotches = np.sin(world_x * look["blotch"]) * np.cos(world_z * look["blotch"]) * 12.0
    ground = look["ground"] + texture + blotches[..., None].astype(np.float32)
    image[below] = ground[below]
    asphalt = look["road"] + texture * 0.5
    image[road_mask] = asphalt[road_mask]
    image[road_mask & (dashes | edges)] = look["paint"]
    image *= look["light"]
    return np.clip(image, 0, 255).astype(np.uint8), road_mask


def _look(rng: np.random.Generator) -> dict:
    grey = float(rng.uniform(60, 130))
    return {
        "horizon": float(rng.uniform(0.35, 0.5)),
        "sky": np.array([rng.uniform(120, 180), rng.uniform(160, 210), 235], dtype=np.float32),
        "ground": GROUND_COLOURS[rng.integers(len(GROUND_COLOURS))] + rng.normal(0, 10, 3).astype(np.float32),
        "road": np.full(3, grey, dtype=np.float32) + rng.normal(0, 4, 3).astype(np.float32),
        "paint": np.array([235, 235, 220], dtype=np.float32),
        "texture": float(rng.uniform(4, 14)),
        "blotch": float(rng.uniform(0.3, 1.2)),
        "light": float(rng.uniform(0.8, 1.15)),
    }


def ego_track(road: Road, frames: int, rng: np.random.Generator) -> tuple[list[tuple], np.ndarray]:
    """Poses (x, z, yaw) of the car over `frames` frames and the [frames, 9] ego-motion rows."""
    speed = float(rng.uniform(3.0, 12.0))
    lateral = float(rng.uniform(-0.4, 0.4)) * road.half_width
    heading_error = float(rng.uniform(-0.15, 0.15))
    start = float(rng.uniform(0, 50))
    poses = []
    for t in range(frames):
        z = start + speed * FRAME_SECONDS * t
        poses.append((float(road.centre(np.array(z))) + lateral, z, road.heading(z) + heading_error))
    last_x, last_z, last_yaw = poses[-1]
    rows = []
    for x, z, yaw in poses:
        dx, dz = x - last_x, z - last_z
        across = dx * math.cos(last_yaw) - dz * math.sin(last_yaw)
        ahead = dx * math.sin(last_yaw) + dz * math.cos(last_yaw)
        rows.append([across, 0.0, ahead, 0.0, 0.0, yaw - last_yaw, 0.0, 0.0, speed])
    return poses, np.array(rows, dtype=np.float64)


def write_sample(root: Path, sample_id: str, options: RoadSetOptions, rng: np.random.Generator) -> dict:
    """Render one sample's images and masks under `root`; its manifest row (paths relative to root)."""
    road = random_road(rng)
    look = _look(rng)
    poses, ego = ego_track(road, options.frames, rng)
    images: dict[str, list[str]] = {view: [] for view in VIEWS}
    masks: dict[str, list[str]] = {view: [] for view in VIEWS}
    for folder in ("images", "masks"):
        (root / folder / sample_id).mkdir(parents=True)
    for t, pose in enumerate(poses):
        for view in VIEWS:
            pixels, mask = render_view(road, pose, view, options.image_size, look, rng)
            image_path = f"images/{sample_id}/{view}_{t}.png"
            mask_path = f"masks/{sample_id}/{view}_{t}.png"
            Image.fromarray(pixels).save(root / image_path)
            Image.fromarray(mask.astype(np.uint8) * 255).save(root / mask_path)
            images[view].append(image_path)
            masks[view].append(mask_path)
    return {"id": sample_id, "images": images, "masks": masks, "ego_motion": np.round(ego, 6).tolist()}


def write_road_set(root: Path, options: RoadSetOptions) -> Path:
    """Every sample and `manifest.jsonl` (a `split` column: train / val) under `root`."""
    rng = np.random.default_rng(options.seed)
    rows = []
    for split, count in (("train", options.train_samples), ("val", options.eval_samples)):
        for index in range(count):
            row = write_sample(root, f"{split}_{index:04d}", options, rng)
            rows.append({**row, "split": split})
    with (root / "manifest.jsonl").open("w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return root / "manifest.jsonl"


def road_set_dir(cache_dir: Path, options: RoadSetOptions) -> Path:
    return Path(cache_dir) / "synthetic_roads" / options.fingerprint()


def ensure_road_set(cache_dir: Path, options: RoadSetOptions) -> Path:
    """The manifest of the set `options` describes, generated once under `cache_dir` (concurrent ranks
    and test workers end with one complete copy)."""
    root = road_set_dir(cache_dir, options)
    build_once(root, MARKER, lambda staging: write_road_set(staging, options), "synthetic road set")
    return root / "manifest.jsonl"
