"""Fault cases: what a run does with bad input and interruptions around its start (non-finite values,
early signals, resuming past max_steps, a checkpoint without its manifest, a lock race)."""

from __future__ import annotations

from pathlib import Path

from faults.harness import case, cli, mlp

# --- values -------------------------------------------------------------------------------------------


@case(
    "train.adam_epsilon=1e400 (reads as inf) and train.learning_rate=.nan",
    "both refused together as not finite, before anything is written (inf used to pass, train nothing "
    "and exit 0)",
)
def non_finite_floats_are_refused(tmp: Path) -> str:
    config, run = mlp(tmp)
    bad = cli("train", str(config), "train.adam_epsilon=1e400", "train.learning_rate=.nan")
    assert bad.rc == 1, bad.err[-2000:]
    for key in ("train.adam_epsilon: got inf", "train.learning_rate: got nan"):
        assert key in bad.err and "must be a finite number" in bad.err, bad.err
    assert not run.exists()
    return "exit 1, '2 problem(s)': adam_epsilon got inf, learning_rate got nan: must be a finite number"
