"""`framer-ds bench --compile`: each cell also runs with train.compile=true as a `<strategy>+compile` row,
whose compile time is its step 1 minus the eager twin's; the table grows the two step-1 columns only then
(the real launches are covered by tests/train/test_compile.py; this checks the bookkeeping)."""

from __future__ import annotations

from framer_ds.lab.bench import add_compile_times, markdown
from framer_ds.lab.bench_rows import BenchRow


def test_compile_time_is_step_one_over_the_eager_twin():
    rows = [
        BenchRow("ddp", 2, True, peak_mib_per_rank=[10.0], s_per_step=0.2, first_step_s=1.5),
        BenchRow("ddp+compile", 2, True, peak_mib_per_rank=[9.0], s_per_step=0.15, first_step_s=31.5),
        BenchRow("zero2+compile", 2, True, s_per_step=0.3, first_step_s=40.0),  # no eager twin measured
    ]
    add_compile_times(rows)
    assert [r.compile_s for r in rows] == [None, 30.0, None]
    table = markdown(rows)
    assert "| s/step | step 1 s | compile s |" in table
    assert "| ddp+compile | 2 | 9 | 0.150 | 31.50 | 30.0 |" in table
    assert "step 1 s" not in markdown(rows[:1])  # an eager-only bench keeps its columns
