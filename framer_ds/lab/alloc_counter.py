"""Build the allocation counter (alloc_counter.c) once and preload it into benchmark processes.

On a GPU, `torch.cuda.max_memory_allocated` is the measure; on a CPU nothing in torch counts every
allocation of every thread, so CPU memory benchmarks run their processes with this library in
LD_PRELOAD. It keeps two peaks: every allocation of the process (`memory/max_allocated_gb` in the run's
metrics) and tensor bytes alone (`memory/max_tensor_allocated_gb`: CPU tensor storage allocated by c10
and mapped weight files, what a GPU's allocator would hold); framer_ds/lab/measure.py reads both after
every optimizer step, and `log_counter_peaks` puts them in the run's metrics lines. The ctypes binding
lives here, in the lab, and nowhere else: the engine only takes figures through
`engine.metrics.add_memory_probe`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from framer_ds.storage.atomic import build_once

SOURCE = Path(__file__).with_name("alloc_counter.c")
LIBRARY = "libframer_alloc_counter.so"
MARKER = ".framer_alloc_counter_built"


def build_alloc_counter(cache_dir: Path) -> Path:
    """The compiled library under `cache_dir` (rebuilt when the source changes); needs a C compiler."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError(
            "measuring CPU memory needs a C compiler to build the allocation counter; install gcc "
            "(apt-get install gcc) or set CC"
        )
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = cache_dir / f"alloc_counter_{digest}"

    def build(staging: Path) -> None:
        command = [compiler, "-O2", "-shared", "-fPIC", "-o", str(staging / LIBRARY), str(SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building the allocation counter failed:\n{done.stderr}")

    return build_once(target, MARKER, build, "allocation counter") / LIBRARY


def preload_env(library: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the counter preloaded in front of any LD_PRELOAD already set."""
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
