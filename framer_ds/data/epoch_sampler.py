"""The base of the training orders that are a pure function of (seed, epoch) (tts_lm's length-grouped
and ratio-mix orders, video_lora's bucket order): every rank derives the same order, accelerate hands
each rank its own batches of it, and a resumed run replays the epoch's order and skips what was
already trained (`train/step.py`: `set_loader_epoch`, `skip_first_batches`)."""

from __future__ import annotations

from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """A sampler whose order changes with `set_epoch` (accelerate calls it through its wrappers)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
