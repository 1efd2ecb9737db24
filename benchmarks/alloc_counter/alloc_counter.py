"""Build the allocation counter (alloc_counter.c beside this file) and preload it into measured processes.

Why a benchmark tool and not part of framer_ds: the package compiles no C at run time (issue 46). The
counter is what the CPU memory benchmarks measure with (`strategy_memory.py`, `planner_accuracy.py`,
`framer-ds bench` on a CPU): every allocation of a process, and tensor bytes alone (what a GPU's
`max_memory_allocated` means), which neither RSS nor a maintained profiler gives on a CPU (README.md).
framer_ds reads the counter's `framer_alloc_*` symbols when a process has them (framer_ds/lab/
alloc_counter.py) and never imports this file.

    python benchmarks/alloc_counter/alloc_counter.py           # builds, prints the library's path
    FRAMER_DS_ALLOC_COUNTER=$(python benchmarks/alloc_counter/alloc_counter.py) framer-ds bench CONFIG ...
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("alloc_counter.c")
LIBRARY = "libframer_alloc_counter.so"
MARKER = ".framer_alloc_counter_built"


def build_alloc_counter(cache_dir: Path) -> Path:
    """The compiled library under `cache_dir` (rebuilt when the source changes); needs a C compiler."""
    from framer_ds.storage.atomic import build_once

    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError(
            "building the allocation counter needs a C compiler; install gcc (apt-get install gcc) or set CC"
        )
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = cache_dir / f"alloc_counter_{digest}"

    def build(staging: Path) -> None:
        command = [compiler, "-O2", "-shared", "-fPIC", "-o", str(staging / LIBRARY), str(SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building the allocation counter failed:\n{done.stderr}")

    return build_once(target, MARKER, build, "allocation counter") / LIBRARY


def counter_env(cache_dir: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with FRAMER_DS_ALLOC_COUNTER naming the built library: what
    framer_ds/lab/measure.py's `measurement_env` preloads into every measured rank on a CPU."""
    from framer_ds.lab.alloc_counter import COUNTER_ENV

    return {**(os.environ if env is None else env), COUNTER_ENV: str(build_alloc_counter(cache_dir))}


def cpu_counter_env(cache_dir: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`counter_env` on a machine without a GPU (where the CPU benchmarks need the counter); `env` as it is
    on a GPU (torch.cuda.max_memory_allocated measures there)."""
    import torch

    if torch.cuda.is_available():
        return dict(os.environ if env is None else env)
    return counter_env(cache_dir, env)


if __name__ == "__main__":
    from framer_ds.storage.locations import default_cache_dir

    print(build_alloc_counter(Path(sys.argv[1]) if len(sys.argv) > 1 else default_cache_dir()))
