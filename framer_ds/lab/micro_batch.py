"""Micro-batch arithmetic of `framer-ds plan`: the largest micro-batch a memory test accepts, the largest
worth searching, and a global batch split into micro-batch x accumulation.

Why its own module: this is integer search and division, the same whatever memory model asks the
question; the planner (planner.py) supplies the memory test and the hardware.
"""

from __future__ import annotations

import math
from collections.abc import Callable

MAX_MICRO_BATCH = 4096


def largest_fitting(fits: Callable[[int], bool], limit: int = MAX_MICRO_BATCH) -> int:
    """The largest k in [1, limit] with fits(k), for a monotone fits; 0 when none."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def micro_batch_limit(train_examples: int | None, world: int) -> tuple[int, str]:
    """The largest micro-batch worth searching and what sets it: a rank never sees a micro-batch larger
    than its share of the training set (1,437 examples on 1 rank: 1,437, not 4,096)."""
    if train_examples is not None and math.ceil(train_examples / world) < MAX_MICRO_BATCH:
        return max(1, math.ceil(train_examples / world)), "data"
    return MAX_MICRO_BATCH, "search limit"


def split_batch(global_batch: int, world: int, largest: int) -> tuple[int, int]:
    """(micro-batch, accumulation) for `global_batch` over `world` ranks, the micro-batch at most
    `largest`: the largest one that divides each rank's share, so the global batch stays exact; when
    the share does not split over the ranks, the largest micro-batch with accumulation rounded up."""
    if global_batch % world:
        return largest, max(1, math.ceil(global_batch / (largest * world)))
    share = global_batch // world
    micro = max(d for d in range(1, min(largest, share) + 1) if share % d == 0)
    return micro, share // micro
