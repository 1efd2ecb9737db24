"""A stop signal is answered at the next safe point: between two pieces of work, never by starting one.

Why: the loop used to learn of a stop only from the flag its micro-batches exchange, so a signal that
came during the backward, the optimizer step or an action was noticed one whole training step later,
and the step that did notice it still ran every due action (an evaluation, a `best/` export, a round
of samples: minutes on a video model) before the checkpoint. Slurm's grace period after SIGTERM is
often shorter, and a job killed there loses the checkpoint the signal asked for.

Now the ranks agree on the stop before each piece of work that starts something new (an evaluation,
a `best/` export, samples) and once after every step, before the next one could start. An agreement
is one tiny all-reduce (none on one process), and it is sticky: once every rank has seen the stop,
later checks cost nothing and every rank skips the same actions, so no collective is left waiting.

What a stop skips is not lost: the names of the skipped actions (and the evaluation a skipped
`keep-best` was to judge) go into the stop checkpoint's trainer state, and the resumed run does them
first, from the very weights and random state they would have seen.
"""

from __future__ import annotations

from collections.abc import Callable

from accelerate import Accelerator

from framer_ds.engine.finite import exchange_flags


class AgreedStop:
    """Whether some rank has been asked to stop, agreed by every rank at the points where all of them
    ask (`check`), or learnt from the flag a training step's micro-batches already exchanged (`learn`).

    `requested` is this process's own knowledge (its signal handler); `signal_name` names the signal."""

    def __init__(
        self, accelerator: Accelerator, requested: Callable[[], bool], signal_name: Callable[[], str | None]
    ):
        self._accelerator = accelerator
        self._requested = requested
        self._signal_name = signal_name
        self.agreed = False

    def learn(self, agreed_by_every_rank: bool) -> None:
        """A flag every rank already holds the same value of (a step's exchanged stop flag)."""
        self.agreed = self.agreed or agreed_by_every_rank

    def check(self) -> bool:
        """Whether to stop now. A collective while not yet agreed: call it on every rank at the same
        point, or not at all."""
        if not self.agreed:
            if self._accelerator.num_processes == 1:
                self.agreed = self._requested()
            else:
                self.agreed = exchange_flags(self._accelerator, self._requested())[0]
        return self.agreed

    @property
    def signal_name(self) -> str:
        """What stopped the run, as this rank knows it."""
        return self._signal_name() or "a stop signal on another rank"
