"""Does a checkpoint fit in the time a stop signal leaves before the ranks are SIGKILLed?

Why: a stop (Slurm's TERM on scancel, `scontrol requeue` or preemption; Ctrl-C or TERM under torchrun)
is answered by finishing the step and writing a checkpoint, but the ranks are not given forever.
Slurm SIGKILLs a job's processes `KillWait` seconds after its TERM (site configuration, often 30 s),
and torchrun's agent SIGKILLs its ranks `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds after passing a
signal on (torch's default: 30 s). A large ZeRO state takes longer than that to write, and the stop
checkpoint would be cut off mid-write. What a checkpoint takes is only known once one was written, so
the first checkpoint that takes longer than the window says so, once per run.

The Slurm scripts export `FRAMER_DS_KILL_WAIT_S` (KillWait, from `scontrol show config`) and raise
torchrun's timeout to the 300 s their USR1 warning leaves (scripts/lib/stop_signals.sh).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TORCHRUN_DEFAULT_SHUTDOWN_S = 30


def stop_window(environ: Mapping[str, str] | None = None) -> tuple[float, str] | None:
    """(seconds, what sets them) of the shortest known window between a stop signal and SIGKILL; None
    when nothing kills the ranks after a stop (a plain process, no torchrun, no Slurm)."""
    environ = os.environ if environ is None else environ
    windows: list[tuple[float, str]] = []
    if "TORCHELASTIC_RUN_ID" in environ:  # set by torchrun (and accelerate launch) for its ranks
        timeout = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        seconds = float(timeout) if timeout else TORCHRUN_DEFAULT_SHUTDOWN_S
        windows.append((seconds, f"torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT={seconds:g}"))
    kill_wait = environ.get("FRAMER_DS_KILL_WAIT_S")
    if kill_wait:
        windows.append(
            (
                float(kill_wait),
                f"Slurm's KillWait={float(kill_wait):g} after scancel, scontrol requeue or preemption",
            )
        )
    return min(windows) if windows else None


def slow_checkpoint_warning(
    seconds: float, step: int, environ: Mapping[str, str] | None = None
) -> str | None:
    """The warning when writing checkpoint step_`step` took `seconds`, longer than the stop window."""
    window = stop_window(environ)
    if window is None or seconds <= window[0]:
        return None
    limit, source = window
    return (
        f"warning: checkpoint step_{step} took {seconds:.0f} s to write, but a stop signal leaves "
        f"{limit:g} s ({source}) before the ranks are killed: a checkpoint on a stop would be cut off. "
        "Raise that limit "
        "(TORCH_ELASTIC_SHUTDOWN_TIMEOUT; ask the cluster for a longer KillWait / GraceTime) or checkpoint "
        "less state (docs/cluster.md, Stopping, requeueing, cancelling)"
    )
