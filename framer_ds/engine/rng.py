"""Random streams: one per rank for training draws, and seeded draws on the side of training."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch


def rank_stream_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of rank `rank`'s training draws (diffusion sigmas and noise, dropout masks, conditioning
    dropout): `seed` itself on rank 0 of a fresh run, so a one-process run draws what it always drew;
    otherwise a hash of (seed, rank, step), a stream no other rank, seed or resume point shares.

    Why not accelerate's `set_seed(seed, device_specific=True)` (seed + rank): rank 1 of seed 0 would
    then draw exactly what rank 0 of seed 1 draws, so a seed sweep repeats its draws across runs.
    `step` > 0 is a rank that joins a resumed run with no stream of its own to restore (a world-size
    change); 32 bits because numpy's legacy seeding, which `set_seed` also does, takes no more."""
    if rank == 0 and step == 0:
        return seed
    digest = hashlib.sha256(f"framer_ds training draws: seed {seed} rank {rank} step {step}".encode())
    return int.from_bytes(digest.digest()[:4], "little")


def seed_training_draws(seed: int, rank: int, step: int = 0) -> None:
    """Seed this process's global RNGs (Python, numpy, torch on every device) with its own stream.

    Why per rank: with one seed everywhere, N ranks draw the same sigmas, noise and dropout masks, so a
    global batch of N clips trains at one noise level per step (the gradient's variance of a batch of
    one in that dimension). Call it once the model is built (identically on every rank: the same seed
    before `build_model`, LoRA init included) and before a checkpoint restores each rank's stream
    (`random_states_<rank>.pkl`), which then continues exactly."""
    from accelerate.utils import set_seed

    set_seed(rank_stream_seed(seed, rank, step))


@contextlib.contextmanager
def isolated_seed(seed: int) -> Iterator[None]:
    """Seeded draws that leave the training RNG streams (CPU and this process's GPU) untouched:
    `torch.manual_seed` reseeds every device, so the GPU state must be saved and restored too."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
