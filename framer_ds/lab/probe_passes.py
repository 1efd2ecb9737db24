"""Run the activation probe's passes side by side, one forked process per core.

Why: a probe is several independent fake steps (a training step at micro-batch 1, one at 2, the
evaluation transient; each at two depths for a cut stack), each seconds to tens of seconds of Python on
one core, and `framer-ds plan` is a command a user waits for. The passes share the prepared fake model
and nothing else: each starts from the same state (its own tracker, gradients set to None after), so a
forked copy of the process measures exactly what the parent would (tests/lab/test_probe_passes.py). A
child that fails sends nothing; its passes then run in the parent, which raises their error as a
sequential probe would. Where fork is missing (not Linux or macOS) or one core is usable, the passes
run one after another.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem

PROBE_WORKERS_ENV = "FRAMER_DS_PROBE_WORKERS"
"""Processes the probe's passes may use (default: the cores this process may run on; 1: one after
another in this process)."""


def probe_workers() -> int:
    """The processes for the passes: FRAMER_DS_PROBE_WORKERS, else the usable cores."""
    named = os.environ.get(PROBE_WORKERS_ENV, "").strip()
    if named:
        if not named.isdigit() or int(named) < 1:
            problem = f"{named!r} is not a process count: give a whole number, at least 1 (1: one at a time)"
            raise ConfigError([ConfigProblem(PROBE_WORKERS_ENV, problem)], "environment")
        return int(named)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_passes(passes: Sequence[Callable[[], int]], workers: int | None = None) -> list[int]:
    """Each pass's result, in order: the passes dealt over `workers` processes (this one included)."""
    workers = min(probe_workers() if workers is None else workers, len(passes))
    if workers < 2 or not hasattr(os, "fork"):
        return [run() for run in passes]
    groups = [list(range(len(passes)))[first::workers] for first in range(workers)]
    sys.stdout.flush()
    sys.stderr.flush()
    children = [_fork(passes, group) for group in groups[1:]]
    results: dict[int, int] = {}
    try:
        results.update((i, passes[i]()) for i in groups[0])
        for pid, read, group in children:
            with os.fdopen(read) as pipe:
                sent = pipe.read()
            os.waitpid(pid, 0)
            found = json.loads(sent) if sent else None
            if found is None:  # the child failed: its passes run here, and raise here
                found = [passes[i]() for i in group]
            results.update(zip(group, found, strict=True))
    except BaseException:
        for pid, _, _ in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        raise
    return [results[i] for i in range(len(passes))]


def _fork(passes: Sequence[Callable[[], int]], group: list[int]) -> tuple[int, int, list[int]]:
    """A child running the passes of `group`; (its pid, the pipe its results come down, the group)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read, group
    os.close(read)  # the child: its passes, the peaks down the pipe, and out without the parent's exit
    try:
        # OpenMP's thread pool does not survive a fork: a parallel region in the child (a real
        # torch.zeros of an example batch) would wait for threads that are not there. One thread, as
        # DataLoader workers do.
        torch.set_num_threads(1)
        sent = json.dumps([passes[i]() for i in group])
    except BaseException:
        sent = ""
    try:
        data = sent.encode()
        while data:
            data = data[os.write(write, data) :]
    finally:
        os._exit(0)
