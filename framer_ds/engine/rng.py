"""Seeded draws on the side of training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def isolated_seed(seed: int) -> Iterator[None]:
    """Seeded draws that leave the training RNG streams (CPU and this process's GPU) untouched:
    `torch.manual_seed` reseeds every device, so the GPU state must be saved and restored too."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
