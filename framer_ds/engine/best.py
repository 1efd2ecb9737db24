"""`best/best.json`: the evaluation a run judged best (train.eval.best_metric), read back from disk.

Why on disk and not in memory: keep-last pruning, the divergence advice and `train.resume=best` must all
agree on the best evaluation, also after a resume, a rollback (which sets `best/` aside with the abandoned
timeline, engine/run_dir.py) or a crash. `best/` is published atomically with its record
(train/actions.py, KeepBest), so the record is the one statement of what this timeline's best is.
Which checkpoint holds that model is `engine.checkpoint.best_checkpoint`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

BEST_DIR = "best"
BEST_RECORD = "best.json"


@dataclass(frozen=True)
class BestRecord:
    """best.json: the step of the best evaluation, the metric and mode it was judged by, its value."""

    step: int
    metric: str
    value: float
    mode: str

    def describe(self) -> str:
        return f"{self.metric}={self.value:.4g} at step {self.step}"


def read_best_record(output_dir: Path) -> BestRecord | None:
    """The run's best.json, or None when there is no best/ (no best_metric, no evaluation yet, or set
    aside with an abandoned timeline) or its record is unreadable."""
    try:
        raw = json.loads((Path(output_dir) / BEST_DIR / BEST_RECORD).read_text())
        record = BestRecord(int(raw["step"]), str(raw["metric"]), float(raw["value"]), str(raw["mode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if math.isfinite(record.value) else None
