"""Per-item random draws (augmentation) that are a pure function of (seed, epoch, index): video_lora's
clip offsets, strides, crops and flips, vit_classification's crops and flips.

Why not torch's global RNG: accelerate's loader reads one batch ahead, so when step N's checkpoint
saves the global RNG the augmentation of step N+1's batch has already been drawn from it; the resumed
run draws that batch again from the restored state and every later draw (clip offsets, flips, and the
sigma and noise the training step takes from the same stream) moves onto another trajectory. A draw
keyed by the item's place in training is the same whenever and wherever it is read: before or after a
checkpoint, on any rank, in any DataLoader worker, at any `num_workers`.

The epoch lives in a shared-memory tensor: persistent DataLoader workers keep the copy of the dataset
they were started with, and would otherwise draw every epoch's augmentation as in the first.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch


def item_seed(*key: int) -> int:
    """A 63-bit seed from integers (any sign), well mixed so neighbouring keys give unrelated streams."""
    digest = hashlib.blake2b("|".join(str(int(k)) for k in key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ItemDraws:
    """Hands a dataset one generator per item read: seeded by (seed, epoch, index).

    `set_epoch` is what DataLoaders call on a dataset that has it (accelerate's loader, and the
    training loop's `windows`); `at_epoch` pins the epoch for reads outside the training order (the
    latent cache's k-th copy of a clip is drawn as epoch k; sampling inputs as epoch 0), in this
    process only, so it never disturbs what a worker is loading meanwhile."""

    def __init__(self, seed: int):
        self.seed = seed
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._pinned: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        return self._pinned if self._pinned is not None else int(self._epoch.item())

    @contextlib.contextmanager
    def at_epoch(self, epoch: int) -> Iterator[None]:
        previous, self._pinned = self._pinned, int(epoch)
        try:
            yield
        finally:
            self._pinned = previous

    def generator(self, index: int) -> torch.Generator:
        return torch.Generator().manual_seed(item_seed(self.seed, self.epoch, index))


class DrawsPerItem:
    """For a dataset whose items draw augmentation: `draws` None draws from torch's global RNG (ad-hoc
    use, tests), an `ItemDraws` from the item's own generator."""

    draws: ItemDraws | None = None

    def set_epoch(self, epoch: int) -> None:
        if self.draws is not None:
            self.draws.set_epoch(epoch)

    def at_epoch(self, epoch: int) -> contextlib.AbstractContextManager:
        return self.draws.at_epoch(epoch) if self.draws is not None else contextlib.nullcontext()

    def item_generator(self, index: int) -> torch.Generator | None:
        return self.draws.generator(index) if self.draws is not None else None


def drawn_at_epoch(dataset: Any, epoch: int) -> contextlib.AbstractContextManager:
    """`dataset`'s items drawn as in `epoch` (through wrappers that forward attributes); a no-op for a
    dataset without per-item draws."""
    at_epoch = getattr(dataset, "at_epoch", None)
    return at_epoch(epoch) if at_epoch is not None else contextlib.nullcontext()
