"""The GPU suite: every task and strategy measured on one GPU, one JSON line per measurement and a table.

Run it through `bash benchmarks/gpu/run.sh [--smoke] [--only STEP,...] [--out DIR] [--write FILE]`
(which first installs the carried wheels the machine lacks). Each step runs in its own process group
under its own time limit, so a crash or a hang costs that step only and the table says what happened.
`--smoke` runs every step at tiny sizes on a CPU: CI proves the suite itself works
(tests/lab/test_gpu_suite.py).
`--write docs/benchmarks.md` replaces that file's "GPU suite" section and keeps the raw lines under
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "benchmarks")]  # cells, assets; planner_accuracy, report

SECTION = "## GPU suite"
RESULTS_DIR = REPO / "benchmarks" / "results"
FAIL_ENV = "FRAMER_DS_GPU_SUITE_FAIL"
"""Set to a step's name, that step's process fails at once (tests/lab/test_gpu_suite.py)."""
STEP_SCRIPT = Path(__file__)
"""What each step's process runs (`STEP_SCRIPT --step NAME`): this file; tests/lab/gpu_suite_stub.py
puts itself here, this suite with its measurements stubbed."""


@dataclass(frozen=True)
class Step:
    title: str
    limit_s: int
    smoke_limit_s: int
    run: Callable[[Path, bool], Iterable[dict[str, Any]]]  # records, written one by one as they come


def _tests(work: Path, smoke: bool) -> list[dict[str, Any]]:
    from gpu_tests import run_tests

    return run_tests(work, smoke)


def _cells(step: str) -> Callable[[Path, bool], Iterator[dict[str, Any]]]:
    """Each cell's record as soon as it is measured: a step stopped at its limit (or a device lease that
    ends) keeps the cells it finished (a list returned at the end lost all of them, 2026-11-26)."""

    def run(work: Path, smoke: bool) -> Iterator[dict[str, Any]]:
        from cells import CELLS, measure_cell, steps_for

        port = 29600 + os.getpid() % 200
        for index, cell in enumerate(c for c in CELLS[step](work, smoke) if c.smoke or not smoke):
            record = measure_cell(cell, work / f"{step}_{index}", port + index, steps_for(smoke))
            print(json.dumps(record), flush=True)
            yield record

    return run


def _vit(work: Path, smoke: bool) -> list[dict[str, Any]]:
    from vit_overhead import run

    return run(work, smoke, 29900 + os.getpid() % 50)


def _nonfinite(work: Path, smoke: bool) -> list[dict[str, Any]]:
    from nonfinite_cost import run

    return run(work, smoke)


STEPS: dict[str, Step] = {
    "tests": Step("the gpu-marked tests and the single-GPU strategy tests", 900, 240, _tests),
    "video_lora": Step("video_lora at the real SVD UNet size", 1500, 300, _cells("video_lora")),
    "vit_overhead": Step("ViT-L/16: framer_ds vs a hand-written accelerate loop", 900, 300, _vit),
    "tts_lm": Step("tts_lm with a ~1B Llama at 8192 tokens", 900, 300, _cells("tts_lm")),
    "drivable_vit": Step("drivable_vit, the 16-GPU model at micro-batch 2", 600, 300, _cells("drivable_vit")),
    "nonfinite_check": Step("the cost of the per-micro-batch non-finite check", 600, 240, _nonfinite),
}


def run_one_step(name: str, work: Path, smoke: bool, results: Path) -> None:
    """In the step's own process: run it and append its records to `results`, one JSON line each."""
    if os.environ.get(FAIL_ENV) == name:
        raise SystemExit(f"{FAIL_ENV}={name}: failing on purpose")
    work.mkdir(parents=True, exist_ok=True)
    for record in STEPS[name].run(work, smoke):
        with results.open("a") as out:
            out.write(json.dumps({"step": name, **record}) + "\n")


def drive_step(name: str, args: argparse.Namespace, results: Path) -> dict[str, Any] | None:
    """Run step `name` in a new process group under its limit; a record when it did not finish cleanly."""
    limit = STEPS[name].smoke_limit_s if args.smoke else STEPS[name].limit_s
    log = args.out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(STEP_SCRIPT),
        "--step",
        name,
        "--work",
        str(args.out / "work"),
        "--results",
        str(results),
        *(["--smoke"] if args.smoke else []),
    ]
    started = time.monotonic()
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return {"step": name, "ok": False, "error": f"timed out after {limit} s (log: {log})"}
        finally:
            _kill_leftovers(process.pid)
    print(f"{name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    if code != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        return {"step": name, "ok": False, "error": f"exit {code}: {' '.join(tail)[:300]} (log: {log})"}
    return None


def _kill_leftovers(group: int) -> None:
    """Launchers a step started may outlive it (a rank stuck in a collective): end its whole group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU: does the suite work?")
    parser.add_argument("--only", default=",".join(STEPS), help=f"steps, of: {', '.join(STEPS)}")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_suite")
    parser.add_argument("--write", type=Path, help="replace the GPU suite section of this markdown file")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any measurement failed")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        run_one_step(args.step, args.work, args.smoke, args.results)
        return 0
    selected = [s for s in args.only.split(",") if s]
    unknown = [s for s in selected if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    from report_gpu import environment, markdown

    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    results.unlink(missing_ok=True)
    header = {
        **environment(),
        "command": "bash benchmarks/gpu/run.sh " + shlex.join(sys.argv[1:]),
        "smoke": args.smoke,
    }
    for name in selected:
        print(f"== {name}: {STEPS[name].title}", flush=True)
        failure = drive_step(name, args, results)
        if failure is not None:
            with results.open("a") as out:
                out.write(json.dumps(failure) + "\n")
            print(f"{name}: {failure['error']}", flush=True)
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    table = markdown(records, header, [STEPS[s].title for s in selected], selected)
    (args.out / "gpu_suite.md").write_text(table)
    (args.out / "header.json").write_text(json.dumps(header, indent=2))
    print(table)
    if args.write is not None:
        from report import write_section

        RESULTS_DIR.mkdir(exist_ok=True)
        kept = RESULTS_DIR / f"gpu_suite_{header['date'].replace(' ', '_').replace(':', '')}.jsonl"
        shutil.copyfile(results, kept)
        write_section(args.write, SECTION, table.replace("RAW_RESULTS", str(kept.relative_to(REPO))))
    failed = [r for r in records if not r.get("ok", True)]
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
