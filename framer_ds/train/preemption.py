"""Exit 75 and `preempted.json` for a stop signal at any moment of `framer-ds train`, from its first
line of Python on; kept free of heavy imports (torch, accelerate, pydantic) so an entry point can
install it before them.

Why: the stop handling of the loop (`train/faults.StopRequest`) is installed only once the config is
loaded and torch imported, a second or more after the process started (longer on a busy node). A
SIGTERM or SIGUSR1 in that window (Slurm preempting a job that had just started, scancel at the
start) used to kill the process with 143 or 138 and no marker, so the job was not requeued.

Before the config is read nothing says where the marker goes: the first signal is remembered and the
start-up goes on until the config gives `output_dir` (a second signal exits 75 at once). From then on
a signal writes the marker and exits 75 at once, until the loop's own handling takes over.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from framer_ds.storage.atomic import atomic_write_json

# Exit status of a run that checkpointed because it was asked to stop (Slurm time limit or
# preemption): the Slurm script requeues on it. 75 = EX_TEMPFAIL, "try again later".
EXIT_PREEMPTED = 75
PREEMPTED_MARKER = "preempted.json"
# SIGINT too: Ctrl-C, or `accelerate launch` passing its own SIGINT on to the ranks. A second one aborts.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def write_preempted_marker(
    output_dir: Path,
    signal_name: str,
    *,
    step: int | None = None,
    checkpoint: Path | None = None,
    during_startup: bool = True,
) -> None:
    """What the Slurm script reads to decide on a requeue (the launcher may mask the exit status).
    `step` is None when the signal came before the run knew which checkpoint it resumes from."""
    marker = {
        "step": step,
        "signal": signal_name,
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "during_startup": during_startup,
        "time": time.time(),
    }
    atomic_write_json(Path(output_dir) / PREEMPTED_MARKER, marker)


def clear_preempted_marker(output_dir: Path) -> None:
    """A run that starts is no longer the preempted one: its marker would requeue a finished job."""
    (Path(output_dir) / PREEMPTED_MARKER).unlink(missing_ok=True)


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


class EarlyStop:
    """The stop handling of a `framer-ds train` process until the loop installs its own (see module)."""

    def __init__(self) -> None:
        self.armed = False
        self.output_dir: Path | None = None
        self.pending: str | None = None  # a signal that came before output_dir was known

    def arm(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        self.armed = True

    def disarm(self) -> None:
        """Back to the default actions (a command that is not `train`, or a run that has ended)."""
        if self.armed:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        self.armed, self.output_dir = False, None

    def resend_pending(self) -> None:
        """Not a training run: a signal remembered so far gets its default action now."""
        pending, self.pending = self.pending, None
        self.disarm()
        if pending is not None:
            os.kill(os.getpid(), signal.Signals[pending])

    def knows(self, output_dir: Path | None) -> None:
        """The config is read: a remembered signal stops the run now (SystemExit 75), a later one at once."""
        if not self.armed or output_dir is None:
            return
        self.output_dir = Path(output_dir)
        if self.pending is not None:
            self._stop(self.pending)
            raise SystemExit(EXIT_PREEMPTED)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.output_dir is None and self.pending is None:
            self.pending = name  # go on until the config says where the marker goes
            return
        self._stop(name)
        os._exit(EXIT_PREEMPTED)  # mid-import: an exception could be swallowed or leave torch half built

    def _stop(self, name: str) -> None:
        if self.output_dir is not None and _is_rank_zero():
            write_preempted_marker(self.output_dir, name)
        where = "" if self.output_dir is not None else " (no output_dir yet: no preempted.json)"
        line = f"stopped by {name} before training started{where}; resume with train.resume=latest "
        # os.write, not print: the signal may have interrupted a print, and sys.stderr is not reentrant
        os.write(sys.stderr.fileno(), f"{line}(exit {EXIT_PREEMPTED})\n".encode())


EARLY_STOP = EarlyStop()
