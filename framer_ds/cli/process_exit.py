"""How a `framer-ds` process leaves: a rank of a distributed run skips the interpreter's teardown.

Why: the process groups DeepSpeed and accelerate keep references to (the world group, DeepSpeed's data
parallel group held by every ZeRO-3 parameter and by module globals) outlive
`torch.distributed.destroy_process_group`: it unregisters them, but their gloo threads
(`gloo_tcp_loop`, `pt_gloo_runloop`) run until the last reference dies, which is during the
interpreter's own teardown, in whatever order it frees modules. Measured on a 2-process ZeRO-3 run:
six gloo threads still alive at `atexit` time after `end_accelerator` had destroyed the groups; now and
then a rank then aborted in teardown (`terminate called without an active exception`, exit -6) after a
run that had succeeded and written everything, and the launcher reported the job failed.

A rank therefore flushes what it wrote (stdout, stderr, logging handlers) and leaves with `os._exit`:
the kernel ends its threads, and nothing of the run is lost, because the run has already closed its
trackers, checkpoints and exports (`engine.accelerator.end_accelerator`). A single process (no
WORLD_SIZE above 1) leaves the ordinary way, so its `atexit` hooks run as usual.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

from framer_ds.launch.smoke import launched


def leave(code: int | None) -> NoReturn:
    """End this process with `code` (None: 0), past the interpreter's teardown in a launched rank."""
    code = 0 if code is None else code
    if not launched():
        raise SystemExit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing reaches it
            stream.flush()
    os._exit(code)
