"""The fault matrix: each case injects one fault into a real run (a kill at a chosen phase, a truncated
file, a second run, an edited config, a signal during start-up) and checks what the user gets.

A case returns what it observed and raises AssertionError when the outcome is wrong. The suite runs
every case (tests/faults/test_fault_matrix.py); `scripts/dev/fault_matrix.py` runs them too and prints
the table kept in docs/reliability.md. Cases run single-process in-process where the fault allows, as
real `python -m framer_ds` / `accelerate launch` processes for signals, kills and multi-rank faults.
"""

from __future__ import annotations

# Importing the case modules registers their cases, in this order.
from faults import (  # noqa: F401
    concurrency_cases,
    divergence_cases,
    full_disk_cases,
    input_cases,
    overflow_cases,
    process_cases,
    startup_cases,
    stop_cases,
    storage_cases,
    timeline_cases,
    value_cases,
)
from faults.harness import CASES, Case

__all__ = ["CASES", "Case"]
