"""A real, offline, tiny ImageFolder: scikit-learn's bundled 8x8 digits rendered as PNGs.

Why: examples, smoke tests and CI need an image-classification dataset that exercises the exact
ImageFolder code path users run on ImageNet, without a download (CI machines are often offline)
and in a second. `load_digits()` ships 1,797 real handwritten digits inside scikit-learn.

The folder is built once per cache directory. Every rank of a distributed job may call this at the
same time, so the build is atomic: it is written into a private temp directory and renamed into
place; a `.complete` marker inside the temp directory means a visible folder is always complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from framer_ds.storage.atomic import building_dir, publish_dir

DIGITS_DIRNAME = "digits_imagefolder"
MARKER_NAME = ".complete"
NUM_DIGITS = 1797


def _read_marker(root: Path) -> dict | None:
    """The marker's contents, or None when the folder is absent or was never completed."""
    try:
        return json.loads((root / MARKER_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # present but unreadable: treated as a build with unknown parameters


def _check_marker(root: Path, marker: dict, val_fraction: float, seed: int) -> None:
    """Refuse a cached folder built with another split: silently reusing it would change results."""
    built_with = (marker.get("val_fraction"), marker.get("seed"))
    if built_with != (val_fraction, seed) or marker.get("count") != NUM_DIGITS:
        raise ValueError(
            f"{root} was built with val_fraction={built_with[0]}, seed={built_with[1]}, "
            f"count={marker.get('count')}, but val_fraction={val_fraction}, seed={seed} was asked for. "
            f"Delete {root} to rebuild it, or pass a different cache_dir."
        )


def _render(target: Path, val_fraction: float, seed: int) -> int:
    """Write `target/{train,val}/{digit}/{index:04d}.png` and the marker; returns the image count."""
    from sklearn.datasets import load_digits  # imported here: sklearn is slow to import
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    indices = np.arange(len(pixels))
    try:
        train_idx, val_idx = train_test_split(
            indices, test_size=val_fraction, random_state=seed, stratify=digits.target
        )
    except ValueError as exc:
        raise ValueError(
            f"cannot split the digits with val_fraction={val_fraction} ({exc}); use a value that leaves "
            "at least one image per class (10 classes) in each split, e.g. 0.2."
        ) from exc
    for split, split_idx in (("train", train_idx), ("val", val_idx)):
        for label in range(10):
            (target / split / str(label)).mkdir(parents=True)
        for i in sorted(int(j) for j in split_idx):
            path = target / split / str(int(digits.target[i])) / f"{i:04d}.png"
            Image.fromarray(pixels[i]).save(path)  # 2-D uint8 -> mode "L"
    marker = {"count": len(pixels), "val_fraction": val_fraction, "seed": seed}
    (target / MARKER_NAME).write_text(json.dumps(marker) + "\n")
    return len(pixels)


def _incomplete_error(root: Path) -> RuntimeError:
    return RuntimeError(
        f"{root} exists but is not a complete digits build (no {MARKER_NAME} marker); it was not "
        f"made by framer_ds or was edited by hand. Delete {root} and run again."
    )


def ensure_digits_imagefolder(cache_dir: Path, val_fraction: float = 0.2, seed: int = 0) -> Path:
    """Return `cache_dir/digits_imagefolder`, building it first if needed (idempotent, race-safe)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}; e.g. 0.2.")
    cache_dir = Path(cache_dir).expanduser()
    root = cache_dir / DIGITS_DIRNAME
    marker = _read_marker(root)
    if marker is not None:
        _check_marker(root, marker, val_fraction, seed)
        return root
    if root.is_dir() and any(root.iterdir()):  # fail before spending the render on a doomed rename
        marker = _read_marker(root)  # ...unless another rank published it since the first look
        if marker is None:
            raise _incomplete_error(root)
        _check_marker(root, marker, val_fraction, seed)
        return root
    with building_dir(root) as staging:
        _render(staging, val_fraction, seed)
    # Another process may have published first: its folder is complete by construction, keep it.
    if not publish_dir(staging, root, replace=False) and _read_marker(root) is None:
        raise _incomplete_error(root)
    _check_marker(root, _read_marker(root) or {}, val_fraction, seed)
    return root
