"""The GPU suite's step process (benchmarks/gpu/suite.py `--step NAME`) with its measurements stubbed:
what tests/lab/test_gpu_suite.py runs in place of the real launches on a CPU.

Why: the suite's own logic (a process group per step under its limit, every step's cells built and
measured, one record a line written as it comes, a failed step a row, the table, --strict) is what the
CPU suite can prove; the trainings themselves say nothing on a CPU (the smoke figures are no GPU figures)
and cost minutes of the default suite. Only the sources of figures are replaced: the launch of a cell
(`framer_ds.lab.bench.run_cell`, tested by tests/lab/test_bench.py) writes the run directory a real one
writes, after loading the cell's config with its overrides as the launch would (a renamed key still fails
the step); the plan's prediction, the hand-written loop, the in-process trainings of the non-finite check
and the pytest run of step 1 give fixed figures. Every step's own code runs as shipped around them.
`make test-gpu-suite` runs the real smoke (tests/lab/test_gpu_suite.py, marker `gpu_suite_full`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "benchmarks" / "gpu"), str(REPO / "benchmarks"), str(REPO)]

PEAK_MIB, S_PER_STEP, SAMPLES_PER_S, TOKENS_PER_S = 300.0, 0.25, 8.0, 1500.0
PREDICTED_BYTES = 280.0 * 2**20
HAND_LOOP_SAMPLES_PER_S = 8.4
CHECK_S_PER_STEP = {True: 0.105, False: 0.1}


def run_cell(config, overrides, strategy, processes, steps, out_dir, deepspeed_dir, profile, port, cwd):
    """What `framer_ds.lab.bench.run_cell` returns and leaves behind for a cell that trained: the run's
    config.yaml and metrics.jsonl under `<strategy>_n<processes>/run`, and a measured row."""
    from framer_ds.engine.run_dir import write_run_config
    from framer_ds.lab.bench import RUN_OVERRIDES
    from framer_ds.lab.bench_rows import BenchRow
    from framer_ds.tasks.run_config import load_run_config

    run = Path(out_dir) / f"{strategy}_n{processes}" / "run"
    resolved = load_run_config(
        config, [*overrides, *RUN_OVERRIDES, f"train.length.steps={steps}", f"output_dir={run}"]
    )
    run.mkdir(parents=True)
    write_run_config(resolved)
    tokens = {"tokens_per_s": TOKENS_PER_S} if resolved.task == "tts_lm" else {}
    lines = [{"run_summary": {"strategy": strategy}}] + [
        {"step": step, "loss": 1.0 / step, "samples_per_s": SAMPLES_PER_S, **tokens}
        for step in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return BenchRow(
        strategy,
        processes,
        ok=True,
        peak_mib_per_rank=[PEAK_MIB] * processes,
        s_per_step=S_PER_STEP,
        samples_per_s=SAMPLES_PER_S,
        wall_s=S_PER_STEP * steps,
    )


def run_pytest(command, **kwargs):
    """Step 1's pytest run: its JUnit report (two gpu tests, skipped on a CPU) and exit 0."""
    report = next(Path(arg.split("=", 1)[1]) for arg in command if arg.startswith("--junitxml="))
    report.write_text(
        '<testsuites><testsuite name="pytest" tests="2" failures="0" errors="0" skipped="2"/></testsuites>'
    )
    return subprocess.CompletedProcess(command, 0, "2 skipped", "")


def seconds_per_step(work, smoke, steps, check):
    """The non-finite check's training, its overrides loaded as the real one loads them."""
    import nonfinite_cost

    from framer_ds.tasks.run_config import load_run_config

    load_run_config(nonfinite_cost.CONFIGS / "quickstart.yaml", nonfinite_cost.overrides(work, smoke, steps))
    return CHECK_S_PER_STEP[check]


def install(step: str) -> None:
    """Replace the figures' sources `step` uses, importing only what it imports itself (each step's
    process pays its own start-up)."""
    if step == "tests":
        import gpu_tests

        gpu_tests.subprocess = SimpleNamespace(run=run_pytest)  # this module's subprocess.run only
        return
    if step == "nonfinite_check":
        # nonfinite_cost takes reset_accelerate from step_overhead, whose imports (the training loop, a
        # ViT) only the stubbed trainings need: a stand-in spares them.
        sys.modules["step_overhead"] = SimpleNamespace(reset_accelerate=lambda: None)
        import nonfinite_cost

        nonfinite_cost.seconds_per_step = seconds_per_step
        return
    import framer_ds.lab.bench

    framer_ds.lab.bench.run_cell = run_cell
    # measure_cell imports `predict` when it runs: a stand-in module spares the planner's imports.
    sys.modules["planner_accuracy"] = SimpleNamespace(
        predict=lambda config, strategy, processes: PREDICTED_BYTES
    )
    if step == "vit_overhead":
        import vit_overhead

        vit_overhead.hand_loop_rate = lambda cell, out_dir, port, steps: HAND_LOOP_SAMPLES_PER_S


if __name__ == "__main__":
    import suite

    suite.STEP_SCRIPT = Path(__file__)  # every step's process is this one too
    if "--step" in sys.argv:
        install(sys.argv[sys.argv.index("--step") + 1])
    sys.exit(suite.main())
