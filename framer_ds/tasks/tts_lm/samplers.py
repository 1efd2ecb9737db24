"""Training orders that are a pure function of (seed, epoch): every rank derives the same order and
accelerate hands each rank its own batches of it, so nothing is sharded twice; a resumed run replays
the epoch's order and skips what was already trained."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from framer_ds.data.epoch_sampler import EpochSampler
from framer_ds.tasks.tts_lm.token_sequences import length_grouped_order


class LengthGroupedSampler(EpochSampler):
    """Micro-batches of similar lengths (less padding) in a new order every epoch."""

    def __init__(self, lengths: Sequence[int], micro_batch_size: int, seed: int):
        super().__init__(seed)
        self.lengths = list(lengths)
        self.micro_batch_size = micro_batch_size

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        return iter(length_grouped_order(self.lengths, self.micro_batch_size, self.seed, self.epoch))


class RatioMixSampler(EpochSampler):
    """Indices into ConcatDataset([speech, text]) with text:speech following a linear ramp.

    An epoch holds `n_speech + n_text` positions. Position p of global sample t (epochs counted in
    samples) takes text when the text share so far is below r(t) / (1 + r(t)), r ramping from
    `ratio_start` to `ratio_end` over `ramp_epochs`: every prefix follows the ratio, with no random
    drift. Each source is read in its own seeded permutations, cycling when the ratio asks for more
    of it than it holds.
    """

    def __init__(
        self, n_speech: int, n_text: int, ratio_start: float, ratio_end: float, ramp_epochs: float, seed: int
    ):
        super().__init__(seed)
        self.n_speech, self.n_text = n_speech, n_text
        self.ratio_start, self.ratio_end, self.ramp_epochs = ratio_start, ratio_end, ramp_epochs

    def __len__(self) -> int:
        return self.n_speech + self.n_text

    def ratio_at(self, epochs: float) -> float:
        progress = min(epochs / self.ramp_epochs, 1.0)
        return self.ratio_start + (self.ratio_end - self.ratio_start) * progress

    def _draw(self, source: int, size: int) -> Iterator[int]:
        cycle = 0
        while True:
            rng = np.random.default_rng([self.seed, self.epoch, source, cycle])
            yield from rng.permutation(size).tolist()
            cycle += 1

    def __iter__(self) -> Iterator[int]:
        total = len(self)
        speech, text = self._draw(0, self.n_speech), self._draw(1, self.n_text)
        taken_text = 0
        for position in range(total):
            ratio = self.ratio_at(self.epoch + position / total)
            want_text = ratio / (1.0 + ratio)
            if self.n_text and (taken_text + 1) <= want_text * (position + 1) + 1e-9:
                taken_text += 1
                yield self.n_speech + next(text)
            else:
                yield next(speech)
