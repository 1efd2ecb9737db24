"""Build the allocation counter (alloc_counter.c) once and preload it into benchmark processes.

On a GPU, `torch.cuda.max_memory_allocated` is the measure; on a CPU nothing in torch counts every
allocation of every thread, so CPU memory benchmarks run their processes with this library in
LD_PRELOAD. It keeps two peaks: every allocation of the process (`memory/max_allocated_gb` in the run's
metrics) and tensor bytes alone (`memory/max_tensor_allocated_gb`: CPU tensor storage allocated by c10
and mapped weight files, what a GPU's allocator would hold); framer_ds/lab/measure.py reads both after
every optimizer step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
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
