"""How long a user waits for `framer-ds validate` and `framer-ds plan` on every shipped config.

Why: both run interactively before a job is queued (issue 48's goals, on 2 cores: `validate` <= 3 s for any
shipped config; `plan` <= 15 s cold and <= 3 s warm). Each shipped config (configs/quickstart.yaml and
configs/tasks/**.yaml) runs as a user runs it, in a fresh `python -m framer_ds` process from the
repository root, offline (HF_HUB_OFFLINE=1: the shipped architectures stand in for absent bases):
`validate CONFIG` (which may answer that the recipe's data is not on this machine: that answer is timed
too), then the `plan` command quoted in the config's header (its second line; the quickstart, which
quotes none, `--gpus 1 --gpu-memory 24GB`) twice, with an empty `FRAMER_DS_CACHE` (cold: built-in tiny
models and the activation probes made from nothing) and again on the cache the first plan filled (warm).
Wall time is the user's wait; CPU time (user + system of the process and the probe's forked passes) is
printed beside it because on a machine shared with other jobs the wall time also counts the waits for a
core. Each cell is the median over `--repeats` rounds, each round on a fresh cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTION = "## cli_latency"
GOALS = {"validate": 3.0, "plan cold": 15.0, "plan warm": 3.0}
UNQUOTED_HARDWARE = ["--gpus", "1", "--gpu-memory", "24GB"]
"""The plan of a config whose header quotes no plan command (the quickstart trains on a CPU)."""


@dataclass(frozen=True)
class Timed:
    wall_s: float
    cpu_s: float


def run_timed(argv: list[str], env: dict[str, str], allowed: tuple[int, ...] = (0,)) -> Timed:
    """One `python -m framer_ds ARGV` from the repository root; an exit code not in `allowed` stops the
    benchmark with its stderr (a figure for a command that crashed would be meaningless)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "framer_ds", *argv], cwd=REPO, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in allowed:
        sys.exit(f"framer-ds {shlex.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timed(wall, cpu)


def plan_argv(config: Path) -> list[str]:
    """The `framer-ds plan ...` the config's header quotes (tests/lab/test_planner.py checks it runs), else
    a plan on UNQUOTED_HARDWARE."""
    header = config.read_text().splitlines()[1]
    if "`framer-ds plan " not in header:
        return ["plan", str(config.relative_to(REPO)), *UNQUOTED_HARDWARE]
    command = header.split("`")[1]
    return shlex.split(command)[1:]


def measure_config(config: Path, repeats: int) -> dict[str, list[Timed]]:
    """validate, plan cold and plan warm, `repeats` rounds, each on a fresh FRAMER_DS_CACHE."""
    name = str(config.relative_to(REPO))
    found: dict[str, list[Timed]] = {key: [] for key in GOALS}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="cli_latency_") as cache:
            env = {**os.environ, "FRAMER_DS_CACHE": cache, "HF_HUB_OFFLINE": "1"}
            # exit 1: the config's problems, reported (a shipped recipe's data is not on this machine)
            found["validate"].append(run_timed(["validate", name], env, allowed=(0, 1)))
            found["plan cold"].append(run_timed(plan_argv(config), env))
            found["plan warm"].append(run_timed(plan_argv(config), env))
    return found


def cell(runs: list[Timed]) -> str:
    return f"{statistics.median(r.wall_s for r in runs):.1f} ({statistics.median(r.cpu_s for r in runs):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", help="comma-separated substrings of the configs to run (default all)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds per config, each on a fresh cache")
    parser.add_argument("--label", default="", help="a line saying what was measured (a commit, a state)")
    parser.add_argument("--write", type=Path, help="replace the cli_latency section of this file")
    args = parser.parse_args()
    shipped = [REPO / "configs/quickstart.yaml", *sorted((REPO / "configs/tasks").rglob("*.yaml"))]
    if args.configs:
        wanted = args.configs.split(",")
        shipped = [c for c in shipped if any(w in str(c) for w in wanted)]
    rows = [
        "| config | validate s | plan cold s | plan warm s |",
        "|---|---|---|---|",
    ]
    worst = dict.fromkeys(GOALS, 0.0)
    for config in shipped:
        found = measure_config(config, args.repeats)
        for key, runs in found.items():
            worst[key] = max(worst[key], statistics.median(r.wall_s for r in runs))
        name = config.relative_to(REPO / "configs")
        rows.append(f"| {name} | " + " | ".join(cell(found[key]) for key in GOALS) + " |")
        print(rows[-1], flush=True)
    verdicts = [
        f"{key} slowest {worst[key]:.1f} s, goal <= {goal:.0f} s: {'PASS' if worst[key] <= goal else 'FAIL'}"
        for key, goal in GOALS.items()
    ]
    load = os.getloadavg()[0]
    print("; ".join(verdicts) + f"; 1-minute load average at the end {load:.1f}")
    if args.write is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from report import write_section

        from framer_ds.lab.measure import describe_machine

        method = __doc__.split("\n\n")[1].replace("\n", " ").strip()
        parts = [
            SECTION,
            *([args.label] if args.label else []),
            method,
            f"Command: `python {shlex.join(sys.argv)}`",
            f"Machine: {describe_machine()}; {os.cpu_count()} cores; 1-minute load average at the end: "
            f"{load:.1f} (the benchmark itself keeps about one core busy; more means other jobs ran).",
            "Cells: median wall seconds (CPU seconds of the process in parentheses).",
            "\n".join(rows),
            "; ".join(verdicts) + ".",
        ]
        write_section(args.write, SECTION, "\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
