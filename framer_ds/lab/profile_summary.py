"""Where a profiled step's time goes: compute, communication, data loading, optimizer.

Why a built-in summary: Holistic Trace Analysis (PyPI `HolisticTraceAnalysis`) reads the GPU kernels of
a trace and is the better tool there, so it is used when it is installed and the run had a GPU; a CPU
run (and a machine without HTA) still deserves an answer. The built-in one reads the profiler's own
ranges: `ProfilerStep*` (the whole step), `enumerate(DataLoader)...` (waiting for a batch),
`Optimizer.step...` and the collectives (gloo/NCCL/c10d names); compute is the rest of the step.
Nested ranges are counted once, in the outermost category that holds them, and only on the thread that
runs the steps, so the shares add up to the step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COMMUNICATION = re.compile(r"nccl|gloo|all_?reduce|all_?gather|reduce_?scatter|broadcast|c10d", re.IGNORECASE)
CATEGORIES = ("compute", "communication", "data loading", "optimizer")


def _category(name: str) -> str | None:
    if name.startswith("enumerate(DataLoader)"):
        return "data loading"
    if name.startswith("Optimizer.step"):
        return "optimizer"
    if COMMUNICATION.search(name):
        return "communication"
    return None


def step_breakdown(events: Iterable[Any]) -> dict[str, float]:
    """Seconds per category over the profiled steps, from `profiler.events()` (FunctionEvent objects
    with name, time_range and cpu_parent). CPU time: on a GPU the kernels run asynchronously and the
    HTA breakdown is the one to read."""
    events = list(events)
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    total = sum(e.time_range.elapsed_us() for e in steps)
    # The training thread only: collectives DDP runs on its comm thread overlap backward; what the
    # training thread waits for them is counted where it waits.
    threads = {e.thread for e in steps}
    events = [e for e in events if e.thread in threads]
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for event in events:
        category = _category(event.name)
        if category is None:
            continue
        parent, nested = event.cpu_parent, False
        while parent is not None:  # counted once, in the outermost categorised range
            if _category(parent.name) is not None:
                nested = True
                break
            parent = parent.cpu_parent
        if not nested:
            seconds[category] += event.time_range.elapsed_us() / 1e6
    seconds["compute"] = max(0.0, total / 1e6 - sum(seconds.values()))
    return seconds


def hta_breakdown(trace_dir: Path) -> dict[str, float] | None:
    """HTA's temporal breakdown (compute / non-compute / idle GPU time, rank 0) when HTA is installed and
    the traces hold GPU kernels; None otherwise."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    try:
        frame = TraceAnalysis(trace_dir=str(trace_dir)).get_temporal_breakdown(visualize=False)
    except Exception:  # a CPU-only trace has no kernels: HTA has nothing to say
        return None
    row = frame.iloc[0].to_dict()
    return {str(k): float(v) for k, v in row.items() if isinstance(v, (int, float))}


def format_breakdown(seconds: dict[str, float]) -> str:
    total = sum(seconds.values()) or 1.0
    return ", ".join(f"{name} {value / total:.0%}" for name, value in seconds.items())
