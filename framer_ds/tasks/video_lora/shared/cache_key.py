"""What decides the tensors of a latent-cache entry, beyond the config: the source files and the
frozen encoders' weights. Part of the cache key, so an edited or replaced file invalidates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.shared.data.latent_cache import LatentCache, cache_key
from framer_ds.tasks.video_lora.shared.data.video_clips import ImagePairDataset


def _stat(path: Path) -> list:
    info = Path(path).stat()
    return [str(path), info.st_size, info.st_mtime_ns]


def source_fingerprint(dataset: Dataset) -> list:
    """Each file with its size and modification time, and each video's frame range and fps."""
    if isinstance(dataset, ImagePairDataset):
        return [[pid, *_stat(start), *_stat(end)] for pid, start, end in dataset.pairs]
    return [[r.video_id, r.first_frame, r.stop_frame, r.source_fps, *_stat(r.path)] for r in dataset.records]


def files_fingerprint(base_dir: Path, subfolders: tuple[str, ...]) -> list:
    """The files of a base's frozen encoders (`subfolders` of `base_dir`: they decide every cached
    tensor), with sizes and mtimes."""
    found = []
    for sub in subfolders:
        for path in sorted((Path(base_dir) / sub).glob("*")):
            info = path.stat()
            found.append([f"{sub}/{path.name}", info.st_size, info.st_mtime_ns])
    return found


def cache_basics(config: Any, dataset: Dataset, split: str, copies: int, dtype: str) -> dict[str, Any]:
    """What decides any family's cached tensors: the format, the split and its copies, the seed, the
    source files, the dtype and the mode; each family's `cache_description` adds its own."""
    return {
        "format": CACHE_FORMAT_VERSION,
        "split": split,
        "copies": copies,
        "seed": config.train.seed,
        "source": source_fingerprint(dataset),
        "dtype": dtype,
        "mode": config.model.base.mode,
    }


# bump when the encoding changes what a cached entry holds; 2: a training entry's augmentation is
# drawn from (seed, copy, clip) (data/item_draws.py), no longer from the entry's global-RNG stream
CACHE_FORMAT_VERSION = 2


def latent_cache(
    config: Any, dataset: Dataset, split: str, copies: int, base_dir: Path, described: dict[str, Any]
) -> LatentCache:
    """The split's latent cache: keyed by everything `described` lists (the base family's
    `cache_description`: SVD's `svd.encoding.describe_cache`, Wan's), under `data.cache.dir`."""
    root = config.data.cache.dir or default_cache_dir() / "latent_cache"
    summary = {"split": split, "copies": copies, "videos": len(dataset), "base": str(base_dir)}
    return LatentCache(root, cache_key(described), len(dataset) * copies, summary)
