"""Say so before DeepSpeed compiles a C++ op, and only when it really compiles one.

DeepSpeed JIT-builds its ops (with optimizer offload `cpu_adam`; the CPU shared-memory all-reduce
`deepspeed_shm_comm`, which framer_ds never uses, is not built: engine/deepspeed_unused.py) the first
time a process needs them: about a minute of silence on 2 cores, once per machine, after which torch's
extension cache holds the library. A newcomer's first run otherwise looks hung right there. The
announcement wraps DeepSpeed's `OpBuilder.jit_load` and prints only when the op's library is not in the
cache yet.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

_ANNOUNCED = "_framer_ds_announces_builds"


def op_library(name: str) -> Path:
    """Where torch's extension loader keeps op `name`'s compiled library (the cache it reuses)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False)) / f"{name}.so"


def announce_op_builds() -> None:
    """Wrap DeepSpeed's JIT loader once per process (idempotent)."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    if getattr(OpBuilder.jit_load, _ANNOUNCED, False):
        return
    original = OpBuilder.jit_load

    @functools.wraps(original)
    def jit_load(self, verbose: bool = True):
        library = op_library(self.name)
        if not library.exists():
            print(
                f"building DeepSpeed's {self.name} op once (~1 min on 2 cores), cached in {library.parent}",
                file=sys.stderr,
                flush=True,
            )
        return original(self, verbose)

    setattr(jit_load, _ANNOUNCED, True)
    OpBuilder.jit_load = jit_load
