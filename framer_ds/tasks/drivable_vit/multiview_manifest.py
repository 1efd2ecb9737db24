"""Multi-camera, multi-frame samples from a manifest (JSON lines or Parquet), for segmentation.

A row names, per camera view, the image of each of T frames, the mask(s) of the frames that carry
labels (the last one, or all T), and optionally the ego motion ([T, 9] numbers):

    {"id": "seq1_0042", "split": "train",
     "images": {"left": ["l0.png", "l1.png", "l2.png"], "center": [...], "right": [...]},
     "masks": {"left": ["lm2.png"], "center": [...], "right": [...]},
     "ego_motion": [[0.1, 0, -9.8, 0, 0, 0.01, 0, 0, 4.2], ...]}

Paths are relative to the manifest's folder (or absolute). Masks are single-channel PNGs, 0/1 or 0/255,
the size of their image. Why check before training: a missing view or a short frame list would otherwise
surface as a collate error deep in the first epoch (or, worse, only on one rank); every problem is listed
at once with the sample that has it, or counted and skipped when the user asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from framer_ds.config.errors import InputDataError

EGO_MOTION_DIM = 9


@dataclass(frozen=True)
class ManifestLayout:
    """What a row must hold: the views in model order, frames per sample, which frames carry masks."""

    views: tuple[str, ...]
    frames: int
    mask_frames: str = "last"  # "last" | "all"
    ego_motion: bool = False
    id_column: str = "id"
    images_column: str = "images"
    masks_column: str = "masks"
    ego_column: str = "ego_motion"

    @property
    def labelled_frames(self) -> int:
        return self.frames if self.mask_frames == "all" else 1


@dataclass(frozen=True)
class MultiViewSample:
    sample_id: str
    where: str  # "manifest.jsonl:12", for messages
    images: dict[str, tuple[Path, ...]]  # view -> T paths
    masks: dict[str, tuple[Path, ...]]  # view -> labelled_frames paths (the last ones)
    ego_motion: tuple[tuple[float, ...], ...] | None = None

    def describe(self) -> str:
        return f"sample {self.sample_id!r} ({self.where})"


@dataclass
class ParsedManifest:
    samples: list[MultiViewSample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _paths(value: Any, base: Path) -> list[Path] | None:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        return None
    return [p if (p := Path(v).expanduser()).is_absolute() else base / p for v in value]


def parse_row(row: dict[str, Any], where: str, base: Path, layout: ManifestLayout) -> MultiViewSample | str:
    """The sample of one manifest row, or the problem with it (naming the sample and the fix)."""
    sample_id = str(row.get(layout.id_column, where))
    name = f"sample {sample_id!r} ({where})"
    problems = []
    images, masks = {}, {}
    for column, target in ((layout.images_column, images), (layout.masks_column, masks)):
        by_view = row.get(column)
        if not isinstance(by_view, dict):
            problems.append(f"no {column!r} mapping of view -> paths (the row has {sorted(row)})")
            continue
        missing = [view for view in layout.views if by_view.get(view) is None]
        if missing:
            problems.append(
                f"{column} lacks view(s) {missing} (has {sorted(k for k, v in by_view.items() if v)}); "
                "every sample needs every view in data.views"
            )
        for view in layout.views:
            if by_view.get(view) is not None:
                paths = _paths(by_view[view], base)
                if paths is None:
                    problems.append(f"{column}.{view} is not a path or a list of paths")
                else:
                    target[view] = tuple(paths)
    counts = {view: len(paths) for view, paths in images.items()}
    if counts and set(counts.values()) != {layout.frames}:
        problems.append(
            f"unequal frame counts {counts}; every view needs data.frames = {layout.frames} images"
        )
    for view, paths in masks.items():
        if len(paths) not in (1, layout.frames) or len(paths) < layout.labelled_frames:
            need = f"{layout.frames} (data.mask_frames all)" if layout.mask_frames == "all" else "1 or T"
            problems.append(f"masks.{view} has {len(paths)} path(s); it needs {need}")
        else:
            masks[view] = paths[-layout.labelled_frames :]
    ego = None
    if layout.ego_motion:
        ego = row.get(layout.ego_column)
        shape_ok = (
            isinstance(ego, list | tuple)
            and len(ego) == layout.frames
            and all(isinstance(r, list | tuple) and len(r) == EGO_MOTION_DIM for r in ego)
            and all(isinstance(x, int | float) and np.isfinite(x) for r in ego for x in r)
        )
        if not shape_ok:
            problems.append(
                f"{layout.ego_column} must be {layout.frames} rows of {EGO_MOTION_DIM} finite numbers "
                "(one per frame); add it, or set model.ego_motion false"
            )
        else:
            ego = tuple(tuple(float(x) for x in r) for r in ego)
    if problems:
        return f"{name}: " + "; ".join(problems)
    return MultiViewSample(sample_id, where, images, masks, ego)


def parse_rows(
    rows: Sequence[dict[str, Any]],
    source: Path,
    layout: ManifestLayout,
    line_numbers: Sequence[int] | None = None,
) -> ParsedManifest:
    """Every row's sample, or its problem; `line_numbers`: the rows' lines in `source` (default 1, 2, ...)."""
    parsed = ParsedManifest()
    base = Path(source).parent
    numbers = line_numbers if line_numbers is not None else range(1, len(rows) + 1)
    for number, row in zip(numbers, rows, strict=True):
        result = parse_row(row, f"{Path(source).name}:{number}", base, layout)
        if isinstance(result, str):
            parsed.problems.append(result)
        else:
            parsed.samples.append(result)
    seen: dict[str, str] = {}
    for sample in parsed.samples:
        if sample.sample_id in seen:
            parsed.problems.append(f"{sample.describe()}: the id is also used at {seen[sample.sample_id]}")
        seen.setdefault(sample.sample_id, sample.where)
    return parsed


def file_problems(sample: MultiViewSample, decode: bool) -> list[str]:
    """Missing or unreadable files and masks whose size differs from their image. Reads headers only
    unless `decode` (then every pixel, and the mask values: 0/1 or 0/255)."""
    problems = []
    sizes: dict[Path, tuple[int, int]] = {}
    for view, paths in (*sample.images.items(), *sample.masks.items()):
        for path in paths:
            if path in sizes:
                continue
            try:
                with Image.open(path) as image:
                    sizes[path] = image.size
                    if decode:
                        image.load()
                        if path in sample.masks[view]:
                            values = set(np.unique(np.asarray(image.convert("L"))).tolist())
                            if not (values <= {0, 1} or values <= {0, 255}):
                                problems.append(
                                    f"mask {path} holds values {sorted(values)[:6]}; masks are 0/1 or 0/255"
                                )
            except FileNotFoundError:
                problems.append(f"{path} does not exist")
            except Exception as exc:  # PIL raises several types for damaged files
                problems.append(f"{path} cannot be read ({type(exc).__name__}: {exc})")
    for view, mask_paths in sample.masks.items():
        image_paths = sample.images[view][-len(mask_paths) :]
        for mask, image in zip(mask_paths, image_paths, strict=True):
            if mask in sizes and image in sizes and sizes[mask] != sizes[image]:
                problems.append(
                    f"mask {mask} is {sizes[mask][0]}x{sizes[mask][1]} but its image {image} is "
                    f"{sizes[image][0]}x{sizes[image][1]}; masks must match their image"
                )
    return [f"{sample.describe()}: {p}" for p in problems]


@dataclass(frozen=True)
class EgoStatistics:
    """Per-dimension mean and std of the training set's ego motion (every frame of every sample),
    computed in float64 in manifest order: the same numbers on every rank, stored in the export so
    inference normalises as training did. A constant dimension keeps std 1 (no division by zero)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[MultiViewSample]) -> EgoStatistics:
        rows = [row for s in samples if s.ego_motion is not None for row in s.ego_motion]
        if not rows:
            return cls((0.0,) * EGO_MOTION_DIM, (1.0,) * EGO_MOTION_DIM)
        values = np.asarray(rows, dtype=np.float64)
        std = values.std(axis=0)
        std = np.where(std < 1e-6, 1.0, std)
        return cls(tuple(values.mean(axis=0).tolist()), tuple(std.tolist()))

    def normalise(self, ego: Any) -> torch.Tensor:
        values = torch.as_tensor(np.asarray(ego, dtype=np.float64))
        mean = torch.tensor(self.mean, dtype=torch.float64)
        std = torch.tensor(self.std, dtype=torch.float64)
        return ((values - mean) / std).float()


@dataclass(frozen=True)
class PixelTransform:
    """Resize to `size` x `size` (bilinear for images, nearest for masks) and normalise per channel."""

    size: int
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def image(self, image: Image.Image) -> torch.Tensor:
        image = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        mean = torch.tensor(self.mean).view(3, 1, 1)
        return (pixels - mean) / torch.tensor(self.std).view(3, 1, 1)

    def mask(self, mask: Image.Image) -> torch.Tensor:
        mask = mask.convert("L").resize((self.size, self.size), Image.NEAREST)
        return torch.from_numpy((np.asarray(mask) > 0).astype(np.float32))


def load_image(path: Path, sample: MultiViewSample) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except Exception as exc:
        raise InputDataError(
            f"{sample.describe()}: cannot read {path} ({type(exc).__name__}: {exc}). Run "
            "`framer-ds data check CONFIG` to list every bad sample, and fix them or set "
            "data.bad_samples: skip with data.verify_files: true"
        ) from exc


class MultiViewDataset(Dataset):
    """Items: `pixel_values` [T, V, 3, S, S], `masks` [F, V, S, S] (F = 1 or T, 0/1 floats), and
    `ego_motion` [T, 9] (normalised) when `ego` statistics are given."""

    def __init__(
        self,
        samples: Sequence[MultiViewSample],
        layout: ManifestLayout,
        transform: PixelTransform,
        ego: EgoStatistics | None = None,
    ):
        self.samples = list(samples)
        self.layout = layout
        self.transform = transform
        self.ego = ego

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.samples[index]
        views = self.layout.views
        frames = [
            torch.stack([self.transform.image(load_image(sample.images[v][t], sample)) for v in views])
            for t in range(self.layout.frames)
        ]
        masks = [
            torch.stack([self.transform.mask(load_image(sample.masks[v][f], sample)) for v in views])
            for f in range(self.layout.labelled_frames)
        ]
        item = {"pixel_values": torch.stack(frames), "masks": torch.stack(masks)}
        if self.ego is not None:
            item["ego_motion"] = self.ego.normalise(sample.ego_motion)
        return item
