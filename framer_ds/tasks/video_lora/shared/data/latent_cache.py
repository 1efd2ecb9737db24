"""A directory of pre-encoded training examples (one safetensors file each), built once by all ranks.

Why: a video LoRA run spends GPU memory and time on a frozen VAE and image encoder that produce the
same tensors for the same clip every epoch. Encoding each clip once moves both off the GPU for the
whole run. The store knows nothing about diffusion: it keys a directory by what produced the
tensors, lets every rank fill its share, and refuses to be read until every entry is on disk.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset

from framer_ds.config.errors import InputDataError
from framer_ds.storage.atomic import atomic_file, atomic_write_json

COMPLETE_MARKER = "complete.json"


def cache_key(parts: dict[str, Any]) -> str:
    """Stable short hash of everything that decides the cached tensors (JSON, sorted keys)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class LatentCache:
    """`root/key/entry_0000042.safetensors` + `complete.json` once every entry exists."""

    def __init__(self, root: Path, key: str, size: int, description: dict[str, Any] | None = None):
        self.path = Path(root).expanduser() / key
        self.key, self.size, self.description = key, size, description or {}

    def entry_path(self, index: int) -> Path:
        return self.path / f"entry_{index:07d}.safetensors"

    def marker_matches(self) -> bool:
        """complete.json names this key and size (the entries themselves are not looked at)."""
        marker = self.path / COMPLETE_MARKER
        if not marker.is_file():
            return False
        try:
            recorded = json.loads(marker.read_text())
        except json.JSONDecodeError:
            return False
        return recorded.get("key") == self.key and recorded.get("size") == self.size

    def is_complete(self) -> bool:
        return self.marker_matches() and not self.missing()

    def missing(self) -> list[int]:
        return [i for i in range(self.size) if not self.entry_path(i).is_file()]

    def write_entry(self, index: int, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
        """Atomic: a killed encoder leaves a stray temp file, never a truncated entry. Metadata values
        are stored as JSON (safetensors metadata holds strings only)."""
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        with atomic_file(self.entry_path(index)) as tmp:
            save_file(tensors, str(tmp), {k: json.dumps(v) for k, v in metadata.items()})

    def mark_complete(self) -> None:
        atomic_write_json(
            self.path / COMPLETE_MARKER, {"key": self.key, "size": self.size, **self.description}
        )

    def read_entry(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        path = self.entry_path(index)
        try:
            with safe_open(str(path), framework="pt") as handle:
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
                metadata = {k: json.loads(v) for k, v in (handle.metadata() or {}).items()}
        except (OSError, SafetensorError, ValueError) as exc:
            raise InputDataError(
                f"latent cache entry {path} is unreadable ({type(exc).__name__}: {exc}). Delete "
                f"{self.path} and start again: the cache is rebuilt from the videos."
            ) from exc
        return tensors, metadata


def fill_cache(
    cache: LatentCache,
    encode: Callable[[int], tuple[dict[str, torch.Tensor], dict[str, Any]]],
    rank: int,
    world_size: int,
    barrier: Callable[[], None],
    is_main: bool,
) -> int:
    """Every rank encodes the missing entries `i % world_size == rank`; returns how many it encoded.

    Entries already on disk (an interrupted build) are kept. After the barrier every rank must see
    every entry: on nodes without a shared filesystem they would not, and training would read holes.
    """
    mine = [i for i in cache.missing() if i % world_size == rank]  # one directory scan per step
    for index in mine:
        cache.write_entry(index, *encode(index))
    barrier()
    if is_main and not cache.marker_matches() and not cache.missing():
        cache.mark_complete()
    barrier()
    absent = cache.missing()
    if absent or not cache.marker_matches():
        raise InputDataError(
            f"latent cache {cache.path} lacks {len(absent)} of {cache.size} entries after every rank "
            f"wrote its share (first: {cache.entry_path(absent[0]).name if absent else 'marker'}). The "
            "ranks do not share this directory: set data.cache.dir to a filesystem every node sees."
        )
    return len(mine)


class CachedEntryDataset(Dataset):
    """Entries of a complete cache as dicts: the tensors plus the metadata values."""

    def __init__(self, cache: LatentCache):
        if not cache.is_complete():
            raise InputDataError(f"latent cache {cache.path} is incomplete; build it with fill_cache first.")
        self.cache = cache

    def __len__(self) -> int:
        return self.cache.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        tensors, metadata = self.cache.read_entry(index)
        return {**tensors, **metadata}
