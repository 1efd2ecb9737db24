"""The training order with buckets: every micro-batch holds one bucket's clips, and on N ranks every
rank trains the same bucket in the same step (the shapes ZeRO and the loss normalisation see agree).

How, without a batch sampler of our own: accelerate splits the loader's batches round-robin (rank r
takes batches r, r + N, ...). So the order is cut into blocks of N x micro_batch indices from one
bucket: block k becomes micro-batch k of every rank. Each bucket's clips are permuted by (seed, epoch,
bucket) and its last block is filled with the bucket's own first clips again (a clip seen twice beats a
bucket never trained); the blocks are then shuffled by (seed, epoch). A pure function of (seed, epoch),
so a resumed run replays the epoch's order and skips what it trained (`EpochSampler`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from framer_ds.data.epoch_sampler import EpochSampler


class BucketBlockSampler(EpochSampler):
    """Indices in blocks of `world_size * micro_batch_size`, each block from one bucket."""

    def __init__(self, item_buckets: Sequence[str], micro_batch_size: int, world_size: int, seed: int):
        super().__init__(seed)
        self.block = micro_batch_size * world_size
        self.groups: dict[str, list[int]] = {}
        for index, bucket in enumerate(item_buckets):
            self.groups.setdefault(bucket, []).append(index)
        self.names = sorted(self.groups)

    def _padded(self, size: int) -> int:
        return -(-size // self.block) * self.block

    def __len__(self) -> int:
        return sum(self._padded(len(group)) for group in self.groups.values())

    def blocks(self) -> list[tuple[str, list[int]]]:
        """This epoch's blocks in training order, each with its bucket's name."""
        found = []
        for number, name in enumerate(self.names):
            group = self.groups[name]
            order = np.random.default_rng([self.seed, self.epoch, number]).permutation(len(group))
            padded = [group[order[i % len(group)]] for i in range(self._padded(len(group)))]
            found += [(name, padded[i : i + self.block]) for i in range(0, len(padded), self.block)]
        shuffled = np.random.default_rng([self.seed, self.epoch, len(self.names)]).permutation(len(found))
        return [found[i] for i in shuffled]

    def __iter__(self) -> Iterator[int]:
        for _, indices in self.blocks():
            yield from indices
