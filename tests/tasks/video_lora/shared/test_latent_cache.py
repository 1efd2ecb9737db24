"""The latent cache store: keyed, atomic entries, complete only when every rank's share is on disk."""

from __future__ import annotations

import pytest
import torch

from framer_ds.config.errors import InputDataError
from framer_ds.tasks.video_lora.shared.data.latent_cache import (
    CachedEntryDataset,
    LatentCache,
    cache_key,
    fill_cache,
)


def _encode(calls: list[int]):
    def encode(index: int):
        calls.append(index)
        return {"x": torch.full((2, 3), float(index)), "s": torch.tensor(index * 0.5)}, {"id": f"v{index}"}

    return encode


def test_key_is_stable_and_sensitive() -> None:
    parts = {"b": [1, 2], "a": "x"}
    assert cache_key(parts) == cache_key({"a": "x", "b": [1, 2]})
    assert cache_key(parts) != cache_key({"a": "x", "b": [1, 3]})


def test_two_ranks_fill_their_shares_and_an_interrupted_build_resumes(tmp_path) -> None:
    cache = LatentCache(tmp_path, "k1", 5)
    calls: list[int] = []
    # rank 1 of 2 alone (rank 0 "died"): its entries are written, the cache is not complete
    with pytest.raises(InputDataError, match="do not share this directory"):
        fill_cache(cache, _encode(calls), 1, 2, lambda: None, is_main=False)
    assert calls == [1, 3] and not cache.is_complete()
    # a restart on one process encodes only what is missing
    calls.clear()
    assert fill_cache(cache, _encode(calls), 0, 1, lambda: None, is_main=True) == 3
    assert calls == [0, 2, 4] and cache.is_complete()
    calls.clear()
    assert fill_cache(cache, _encode(calls), 0, 1, lambda: None, is_main=True) == 0 and not calls
    dataset = CachedEntryDataset(cache)
    item = dataset[3]
    assert len(dataset) == 5 and item["id"] == "v3" and torch.equal(item["x"], torch.full((2, 3), 3.0))
    assert item["s"].shape == () and item["s"].item() == 1.5
    assert not list(cache.path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_other_key_or_size_is_not_complete_and_corrupt_entry_names_the_fix(tmp_path) -> None:
    cache = LatentCache(tmp_path, "k1", 2)
    fill_cache(cache, _encode([]), 0, 1, lambda: None, is_main=True)
    assert not LatentCache(tmp_path, "k1", 3).is_complete()
    assert not LatentCache(tmp_path, "k2", 2).is_complete()
    cache.entry_path(1).write_bytes(b"\x00" * 10)
    with pytest.raises(InputDataError, match="Delete"):
        CachedEntryDataset(cache)[1]
    with pytest.raises(InputDataError, match="incomplete"):
        CachedEntryDataset(LatentCache(tmp_path, "k3", 1))
