"""What decides the tensors of a latent-cache entry, beyond the config: the source files and the
frozen encoders' weights. Part of the cache key, so an edited or replaced file invalidates it."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from framer_ds.data.video_clips import ImagePairDataset


def _stat(path: Path) -> list:
    info = Path(path).stat()
    return [str(path), info.st_size, info.st_mtime_ns]


def source_fingerprint(dataset: Dataset) -> list:
    """Each file with its size and modification time, and each video's frame range and fps."""
    if isinstance(dataset, ImagePairDataset):
        return [[pid, *_stat(start), *_stat(end)] for pid, start, end in dataset.pairs]
    return [[r.video_id, r.first_frame, r.stop_frame, r.source_fps, *_stat(r.path)] for r in dataset.records]


def weights_fingerprint(svd_dir: Path) -> list:
    """The frozen encoders' files (the VAE and image encoder decide every cached tensor)."""
    found = []
    for sub in ("vae", "image_encoder"):
        for path in sorted((Path(svd_dir) / sub).glob("*")):
            info = path.stat()
            found.append([f"{sub}/{path.name}", info.st_size, info.st_mtime_ns])
    return found
