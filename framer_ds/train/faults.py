"""Faults the loop survives: non-finite losses and preemption signals, agreed on by every rank.

Both are decided collectively (one tiny all-reduce per micro-batch): a NaN on one rank or a SIGTERM
delivered to one process must change what EVERY rank does next, otherwise the ranks diverge and the
next collective hangs.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from framer_ds.engine.checkpoint import best_checkpoint, newest_checkpoint, step_of
from framer_ds.engine.metrics import last_logged

# EXIT_PREEMPTED and PREEMPTED_MARKER are imported from here too; they live with the start-up handling.
from framer_ds.train.preemption import EXIT_PREEMPTED, PREEMPTED_MARKER, STOP_SIGNALS

__all__ = [
    "EXIT_PREEMPTED",
    "PREEMPTED_MARKER",
    "NonFiniteLossError",
    "NonFiniteTracker",
    "NonFiniteWeightsError",
    "ParentWatchdog",
    "Preempted",
    "StopRequest",
]


class NonFiniteLossError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss: the run is diverging."""


class NonFiniteWeightsError(NonFiniteLossError):
    """The weights after the last step are not finite: `final/` is not exported from them."""


class Preempted(Exception):
    """A stop signal ended the run: after the stop checkpoint (`checkpoint`), or during start-up, before
    training began (`checkpoint` is then the one the run would have resumed from, or None). The run
    writes preempted.json and the CLI exits with EXIT_PREEMPTED, so a Slurm requeue continues it."""

    def __init__(
        self, step: int, signal_name: str, checkpoint: Path | None = None, during_startup: bool = False
    ):
        self.step, self.signal_name, self.checkpoint = step, signal_name, checkpoint
        self.during_startup = during_startup
        if during_startup:
            what = "before training started"
        elif checkpoint is not None and checkpoint.name == f"step_{step}":
            what = f"after step {step}; checkpoint written"
        else:  # the state was not finite (SaveCheckpoint): resuming continues from an earlier checkpoint
            what = f"after step {step}; its state was not finite, so no checkpoint was written (" + (
                f"the newest is {checkpoint.name})" if checkpoint is not None else "there is none)"
            )
        super().__init__(f"stopped by {signal_name} {what}")


class StopRequest:
    """SIGTERM/SIGUSR1/SIGINT (and the death of the launcher that started this rank) ask the run to stop.

    During start-up (model build, data indexing, DeepSpeed init: minutes on a large model) the stop
    happens at once, raising `Preempted` wherever the main thread is; once training runs the request is
    only remembered, so the step in flight finishes and every rank checkpoints it together.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.starting = True
        self.startup_position: tuple[int, Path | None] = (0, None)  # step, checkpoint a resume would use
        self._previous: dict[int, object] = {}
        self._watchdog: ParentWatchdog | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if "LOCAL_RANK" in os.environ:  # started by a launcher (torchrun, accelerate, deepspeed)
            self._watchdog = ParentWatchdog()
            self._watchdog.start()

    def uninstall(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def starting_from(self, step: int, checkpoint: Path) -> None:
        """The checkpoint this run resumes: a stop during the rest of start-up names it in preempted.json."""
        self.startup_position = (step, checkpoint)

    def training_started(self) -> None:
        self.starting = False

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT and self.signal_name is not None:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without the checkpoint
        name = signal.Signals(signum).name
        if self._watchdog is not None and self._watchdog.parent_died:
            name = f"{name} (the launcher, pid {self._watchdog.parent_pid}, died)"
        self.signal_name = name
        if self.starting:
            self.starting = False  # a second signal during the unwinding is only remembered
            step, checkpoint = self.startup_position
            raise Preempted(step, name, checkpoint, during_startup=True)

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


class ParentWatchdog:
    """Stops this rank when the launcher that started it dies: killing `accelerate launch` (SIGKILL, or
    a SIGTERM it does not pass on) used to leave the ranks running, holding GPUs. An orphan is re-parented,
    so its parent pid changes; the watchdog then sends this process SIGTERM, which the stop request turns
    into a checkpoint and exit 75 like any other preemption (or an immediate stop during start-up)."""

    def __init__(self, poll_s: float = 1.0):
        self.parent_pid = os.getppid()
        self.parent_died = False
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="framer_ds-parent-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            if os.getppid() != self.parent_pid:
                self.parent_died = True
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
                return


@dataclass
class NonFiniteTracker:
    """Counts optimizer steps whose window held a non-finite loss; aborts after too many in a row."""

    policy: str  # "skip" | "abort"
    max_consecutive: int
    output_dir: Path  # where the advice finds the checkpoint to resume from
    learning_rate: float  # the advice suggests a tenth of it
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
                + ". "
                + divergence_advice(self.output_dir, self.learning_rate)
                + " Also consider warmup (train.lr_schedule.warmup), bf16 instead of fp16, or checking the "
                "data; train.nonfinite.policy / train.nonfinite.max_consecutive set the policy."
            )


def divergence_advice(output_dir: Path, learning_rate: float) -> str:
    """Where a diverged run continues from, truthfully: the newest finite checkpoint (with its last logged
    loss, which tells a sound one from one already blowing up) and, with train.eval.best_metric, the best
    one (with its metric), which keep_last never prunes. No checkpoint is written from non-finite weights
    or optimizer state (SaveCheckpoint checks before saving), so the newest one on disk is the newest
    finite one, and `train.resume=latest` picks it; `train.resume=best` picks the best."""
    newest = newest_checkpoint(output_dir)
    lower = f"train.optimizer.learning_rate={learning_rate / 10:g}"
    if newest is None:
        return (
            f"There is no checkpoint in {output_dir / 'checkpoints'} to resume from; start again with a "
            f"lower learning rate, e.g. {lower} --overwrite."
        )
    step = step_of(newest)
    logged = last_logged(output_dir, "loss", step)
    loss = "" if logged is None else f", loss {logged[1]:.4g}"
    if logged is not None and logged[0] != step:
        loss += f" at step {logged[0]}"
    newest_text = (
        f"The newest finite checkpoint is {newest} (step {step}{loss}; none was written from non-finite "
        "weights)"
    )
    best = best_checkpoint(output_dir)
    if best is None:
        return f"{newest_text}: resume from it with a lower learning rate, e.g. train.resume=latest {lower}."
    if best.path == newest:
        return (
            f"{newest_text}; it is also the best checkpoint ({best.describe(with_step=False)}): resume from "
            f"it with a lower learning rate, e.g. train.resume=best {lower}."
        )
    return (
        f"{newest_text}. The best checkpoint is {best.path} ({best.describe()}): resume from it with a "
        f"lower learning rate, e.g. train.resume=best {lower} (the newer checkpoints move to "
        "checkpoints/abandoned/), or from the newest with train.resume=latest."
    )
