"""Read the allocation counter when a benchmark preloaded it into this process; nothing is built here.

The counter (benchmarks/alloc_counter/: a C library and its builder, a benchmark tool outside the package,
which framer_ds never imports or compiles) keeps two peaks of a CPU process: every allocation
(`memory/max_allocated_gb` in the run's metrics) and tensor bytes alone (`memory/max_tensor_allocated_gb`:
CPU tensor storage allocated by c10 and mapped weight files, what a GPU's allocator would hold). A measured
launch preloads it into every rank when `FRAMER_DS_ALLOC_COUNTER` names the built library
(lab/measure.py); its figures are read through the `framer_alloc_*` symbols it exports. The engine only
takes figures through `engine.metrics.add_memory_probe`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from pathlib import Path

COUNTER_ENV = "FRAMER_DS_ALLOC_COUNTER"
"""The path of the built counter library (benchmarks/alloc_counter/alloc_counter.py prints it)."""


def counter_library(env: Mapping[str, str] | None = None) -> Path | None:
    """The counter library FRAMER_DS_ALLOC_COUNTER names in `env` (default: this process's), or None; a
    name that is not a file is an error naming the fix (a measurement would silently fall back to RSS)."""
    named = (os.environ if env is None else env).get(COUNTER_ENV)
    if not named:
        return None
    if not Path(named).is_file():
        raise FileNotFoundError(
            f"{COUNTER_ENV}={named} is not a file; build the counter with "
            "`python benchmarks/alloc_counter/alloc_counter.py` and set it to the path that prints"
        )
    return Path(named)


def preload_env(library: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with `library` preloaded in front of any LD_PRELOAD already set."""
    out = dict(os.environ if env is None else env)
    out["LD_PRELOAD"] = " ".join(filter(None, [str(library), out.get("LD_PRELOAD", "")]))
    return out


def counter_function(name: str) -> Callable[..., int]:
    """The preloaded counter's `framer_alloc_<name>` (int64 result); AttributeError when the counter is
    not preloaded into this process."""
    function = getattr(ctypes.CDLL(None), f"framer_alloc_{name}")
    function.restype = ctypes.c_int64
    return function


def log_counter_peaks() -> bool:
    """When the counter is preloaded, every metrics line of this process gets its two peaks
    (`memory/max_allocated_gb`, `memory/max_tensor_allocated_gb`); False (and nothing added) when not."""
    from framer_ds.engine.metrics import add_memory_probe

    try:
        peak, tensor_peak = counter_function("peak_bytes"), counter_function("tensor_peak_bytes")
    except AttributeError:
        return False
    add_memory_probe(
        lambda: {
            "memory/max_allocated_gb": peak() / 2**30,
            "memory/max_tensor_allocated_gb": tensor_peak() / 2**30,
        }
    )
    return True
