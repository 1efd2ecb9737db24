"""Does a checkpoint fit in the time a stop signal leaves before the ranks are SIGKILLed?

Why: a stop (Slurm's TERM on scancel, `scontrol requeue` or preemption; Ctrl-C or TERM under torchrun)
is answered by finishing the step and writing a checkpoint, but the ranks are not given forever.
Slurm SIGKILLs a job's processes `KillWait` seconds after its TERM (site configuration, often 30 s),
and torchrun's agent SIGKILLs its ranks `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds after passing a
signal on (torch's default: 30 s). A large ZeRO state takes longer than that to write, and the stop
checkpoint would be cut off mid-write. What a checkpoint takes is only known once one was written, so
the first checkpoint that takes longer than the window says so, once per run.

Before the first one, at the start of a run, the size is known: a checkpoint holds the trained state
(engine/checkpoint_weights.py: weights, Adam's two fp32 moments and DeepSpeed's fp32 master copy of
every trainable element; a resumed run: the checkpoint it resumed from, measured). At a write rate
of ASSUMED_WRITE_BYTES_PER_S per node (a fast shared filesystem; local NVMe is faster, NFS often
slower) a state that cannot be written within the window is named then, before hours of training.

The Slurm scripts export `FRAMER_DS_KILL_WAIT_S` (KillWait, from `scontrol show config`) and raise
torchrun's timeout to the 300 s their USR1 warning leaves (scripts/lib/stop_signals.sh).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from framer_ds.storage.disk_space import tree_bytes

TORCHRUN_DEFAULT_SHUTDOWN_S = 30
ASSUMED_WRITE_BYTES_PER_S = 1e9  # per node
ADAM_BYTES, MASTER_BYTES = 8, 4  # two fp32 moments; DeepSpeed's fp32 copy of 16-bit weights


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


def trained_state_bytes(parameters: Iterable[torch.nn.Parameter], deepspeed: bool) -> int:
    """What a checkpoint writes for these parameters (all ranks together): each trainable element's
    weight, Adam moments and, under DeepSpeed with 16-bit weights, its fp32 master copy. ZeRO-3's
    partitioned parameters count their full size (`ds_numel`)."""
    total = 0
    for parameter in parameters:
        if parameter.requires_grad:
            size = parameter.element_size()
            master = MASTER_BYTES if deepspeed and size < MASTER_BYTES else 0
            total += getattr(parameter, "ds_numel", parameter.numel()) * (size + ADAM_BYTES + master)
    return total


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 10**8 else f"{n / 1e6:.1f} MB"


def stop_checkpoint_forecast(bytes_per_node: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The warning at the start of a run whose checkpoint (`bytes_per_node` on the busiest node) cannot
    be written within the stop window at ASSUMED_WRITE_BYTES_PER_S; None when it can, or no window."""
    window = stop_window(environ)
    if window is None:
        return None
    limit, source = window
    seconds = bytes_per_node / ASSUMED_WRITE_BYTES_PER_S
    if seconds <= limit:
        return None
    return (
        f"warning: a checkpoint of this run writes about {_size(bytes_per_node)} on one node: "
        f"{seconds:.3g} s at {ASSUMED_WRITE_BYTES_PER_S / 1e9:g} GB/s, and a stop signal leaves only "
        f"{limit:g} s ({source}) before the ranks are killed, so a checkpoint on a stop would be cut off. "
        "Raise that limit (TORCH_ELASTIC_SHUTDOWN_TIMEOUT; ask the cluster for a longer KillWait / "
        "GraceTime), shard the state over more nodes (ZeRO) or train less of the model (docs/cluster.md, "
        "Stopping, requeueing, cancelling)"
    )


def checkpoint_bytes_per_node(
    model: torch.nn.Module, num_processes: int, sharded: bool, deepspeed: bool, resumed_from: Path | None
) -> int:
    """What one node writes for a checkpoint of this run: the one it resumed from, as measured on disk,
    else `trained_state_bytes`. Sharded state (ZeRO, FSDP2) is split over the ranks, each writing its
    own; otherwise rank 0 writes it all."""
    total = (
        tree_bytes(resumed_from)
        if resumed_from is not None
        else trained_state_bytes(model.parameters(), deepspeed)
    )
    if not sharded:
        return total
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", num_processes))  # torchrun sets it per node
    return total * min(per_node, num_processes) // max(num_processes, 1)
