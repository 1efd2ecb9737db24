"""`framer-ds` command line: parse, call, print. No training logic lives here."""

import sys
from pathlib import Path

if Path(getattr(sys, "argv", [""])[0]).name == "framer-ds":
    # The console script imports cli.main (pydantic, ~1 s on a busy node) before calling it: the stop
    # signals are handled from here on, as `python -m framer_ds` does in __main__ (train/preemption.py).
    from framer_ds.train.preemption import EARLY_STOP

    EARLY_STOP.arm()
