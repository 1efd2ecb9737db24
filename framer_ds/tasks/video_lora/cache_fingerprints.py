"""What decides the tensors of a latent-cache entry, beyond the config: the source files and the
frozen encoders' weights. Part of the cache key, so an edited or replaced file invalidates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from framer_ds.storage.locations import default_cache_dir
from framer_ds.tasks.video_lora.data.latent_cache import LatentCache, cache_key
from framer_ds.tasks.video_lora.data.video_clips import ImagePairDataset


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


def describe_cache(
    config: Any, dataset: Dataset, split: str, copies: int, svd_dir: Path, dtype: str
) -> dict[str, Any]:
    """Everything that decides a split's cached tensors of an SVD-family base: the cache key is its hash."""
    options, data = config.model, config.data
    motion = getattr(dataset, "motion_fingerprint", None)  # through wrappers
    return {
        **cache_basics(config, dataset, split, copies, dtype),
        "svd": files_fingerprint(svd_dir, ("vae", "image_encoder")),
        "cond_noise": [options.edm.cond_noise_mean, options.edm.cond_noise_std],
        "vae_tile_size": options.vae_tile_size,
        # from_data entries store their bucket and training prefers it to the fixed one: never mix them
        "motion_from_data": options.motion_bucket == "from_data",
        # model.motion_bucket from_data: each entry stores its bucket, which the training quantiles decide
        **({"motion_buckets": motion()} if motion is not None else {}),
        "data": data.model_dump(mode="json", exclude={"cache", "val_fraction", "source", "tracks"}),
        # entries then store their clip placement; the tracks themselves are applied at load
        **({"placement": True} if data.tracks is not None else {}),
    }


def latent_cache(
    config: Any, dataset: Dataset, split: str, copies: int, base_dir: Path, described: dict[str, Any]
) -> LatentCache:
    """The split's latent cache: keyed by everything `described` lists (the base family's
    `cache_description`, e.g. `describe_cache`), under `data.cache.dir`."""
    root = config.data.cache.dir or default_cache_dir() / "latent_cache"
    summary = {"split": split, "copies": copies, "videos": len(dataset), "base": str(base_dir)}
    return LatentCache(root, cache_key(described), len(dataset) * copies, summary)
