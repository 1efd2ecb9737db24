"""Faults the loop survives: non-finite losses and preemption signals, agreed on by every rank.

Both are decided collectively (one tiny all-reduce per micro-batch): a NaN on one rank or a SIGTERM
delivered to one process must change what EVERY rank does next, otherwise the ranks diverge and the
next collective hangs.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator

from framer_ds.storage.atomic import atomic_write_json

# Exit status of a run that checkpointed because it was asked to stop (Slurm time limit or
# preemption): the Slurm script requeues on it. 75 = EX_TEMPFAIL, "try again later".
EXIT_PREEMPTED = 75
PREEMPTED_MARKER = "preempted.json"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class NonFiniteLossError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss: the run is diverging."""


class Preempted(Exception):
    """Raised after the stop checkpoint is written; the CLI exits with EXIT_PREEMPTED."""

    def __init__(self, step: int, signal_name: str):
        self.step = step
        self.signal_name = signal_name
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint written")


class StopRequest:
    """Remembers a SIGTERM/SIGUSR1 instead of dying, so the current step finishes and is saved."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


def exchange_flags(accelerator: Accelerator, *flags: bool) -> list[bool]:
    """Whether ANY rank raised each flag (one all-reduce for all of them)."""
    local = torch.tensor([float(f) for f in flags], device=accelerator.device)
    if accelerator.num_processes > 1:
        local = accelerator.reduce(local, reduction="sum")
    return [bool(v > 0) for v in local.tolist()]


@dataclass
class NonFiniteTracker:
    """Counts optimizer steps whose window held a non-finite loss; aborts after too many in a row."""

    policy: str  # "skip" | "abort"
    max_consecutive: int
    skipped_total: int = 0
    consecutive: int = 0

    def record_window(self, poisoned: bool, step: int) -> None:
        if not poisoned:
            self.consecutive = 0
            return
        self.skipped_total += 1
        self.consecutive += 1
        if self.policy == "abort" or self.consecutive >= self.max_consecutive:
            raise NonFiniteLossError(
                f"non-finite loss (NaN/inf) at optimizer step {step + 1}"
                + (f", {self.consecutive} steps in a row" if self.policy == "skip" else "")
                + ". No checkpoint was written from these weights; the last checkpoint is clean. "
                "Lower train.learning_rate, add warmup (train.warmup_steps), use bf16 instead of fp16, "
                "or check the data; train.nonfinite_loss / train.max_consecutive_nonfinite set the policy."
            )


def write_preempted_marker(output_dir: Path, step: int, signal_name: str, checkpoint: Path) -> None:
    """What the Slurm script reads to decide on a requeue (the launcher may mask the exit status)."""
    marker = {"step": step, "signal": signal_name, "checkpoint": str(checkpoint), "time": time.time()}
    atomic_write_json(Path(output_dir) / PREEMPTED_MARKER, marker)
