"""How the suite spreads over pytest-xdist workers (`make test` runs `-n <cores> --dist loadfile
--no-loadscope-reorder`).

Each test file is one unit of work, so a module-scoped fixture (the suite's 2-process reference runs and
trained models) is built once, by the one worker that runs the file. (`--dist loadgroup` with
`xdist_group` marks would balance finer, but pytest-xdist 3.8 marks a group by rewriting `item._nodeid`,
which pytest 9.2 no longer reads: the groups were silently split and such fixtures built on both
workers.)

The files start heaviest first (longest-processing-time first): a file of multi-process tests that
started last would leave the other worker idle while it ran. A file's weight is its measured seconds where
`MEASURED_S` names it (the heaviest files, whose cost is mostly module fixtures and subprocesses that the
markers cannot see: the offline plan of every config was marked like one slow test and started 23rd), else
a static estimate from its tests' markers (`distributed`, `slow`). Within a file the order is pytest's own.
With one worker (or plain `pytest`) only the file order changes.
"""

from __future__ import annotations

import pytest

# Seconds a test of each kind takes on 2 cores, roughly: only the ranking matters. A test on the real
# two-node cluster (`cluster`: several launches, Slurm's requeues) takes 1-5 minutes: without its own
# weight that file ranked 7th and started after files a fifth as long, and ran on alone at the end.
WEIGHT_PLAIN, WEIGHT_SLOW, WEIGHT_DISTRIBUTED, WEIGHT_CLUSTER = 0.2, 40.0, 40.0, 150.0


# Seconds on one worker of a 2-worker `make test` on 2 cores (`pytest --durations`: the file's tests and
# fixtures summed): only the ranking matters, so figures from a loaded machine (2-3x a quiet one's) rank
# as well. Keep it current when a file's cost changes by more than a third (README, Development, has how).
# Measured on the 2026-11-29 fresh-clone run of f020900 (30 min, a quiet machine; the summary "seconds per
# test file" that every run prints at its end).
MEASURED_S: dict[str, float] = {
    "tests/lab/test_planner.py": 224,
    "tests/launch/test_cluster.py": 484,  # mostly waits on Slurm (README)
    "tests/lab/test_smoke.py": 258,
    "tests/engine/test_strategy_equivalence.py": 201,
    "tests/tasks/tts_lm/test_tts_lm.py": 199,
    "tests/engine/test_resume_world_size.py": 131,
    "tests/tasks/video_lora/shared/test_interp_eval.py": 135,
    "tests/faults/test_fault_matrix.py": 136,
    "tests/engine/test_fsdp2.py": 142,  # 108 x 1.32: the CPU of test_compile's 2-process check, moved here
    "tests/tasks/test_task_contract.py": 110,
    "tests/train/test_compile.py": 14,  # 85 x 0.16: in-process only since its 2-process check moved
    "tests/train/test_optimizer_8bit.py": 117,
    "tests/train/test_faults.py": 133,
    "tests/tasks/video_lora/test_video_resume.py": 90,
    "tests/tasks/video_lora/wan/test_wan_family.py": 96,
    "tests/engine/test_lora_zero3.py": 72,
    "tests/launch/test_launchers.py": 84,
    "tests/lab/test_gpu_suite.py": 60,  # launches stubbed: 101 s alone at load 4-6, 42 s the tiny TTS set
}


def file_weight(path: str, tests: list[pytest.Item]) -> float:
    """`MEASURED_S[path]` where measured, else the markers' estimate summed over the file's tests."""
    return MEASURED_S.get(path, sum(item_weight(item) for item in tests))


def item_weight(item: pytest.Item) -> float:
    weight = WEIGHT_PLAIN
    if item.get_closest_marker("slow"):
        weight += WEIGHT_SLOW
    if item.get_closest_marker("distributed"):
        weight += WEIGHT_DISTRIBUTED
    if item.get_closest_marker("cluster"):
        weight += WEIGHT_CLUSTER
    return weight


def order_heaviest_first(items: list[pytest.Item]) -> None:
    """The files' order, heaviest first, in place (module docstring); each file's tests stay together."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    weight = {path: file_weight(path, tests) for path, tests in files.items()}
    ordered = sorted(files, key=lambda path: -weight[path])  # stable: collection order among equals
    items[:] = [item for path in ordered for item in files[path]]


class FileSeconds:
    """The seconds each test file took (its tests' setup, call and teardown summed, as a worker spent
    them), printed heaviest first at the end of the run: what `MEASURED_S` and the README's heaviest-files
    table are kept current from, read off any run (a CI log included) instead of a separate
    `--durations=0` run. Under xdist the reports reach the controller with their durations."""

    SHOWN = 25

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.seconds:
            return
        heaviest = sorted(self.seconds.items(), key=lambda item: -item[1])[: self.SHOWN]
        title = f"seconds per test file (heaviest {len(heaviest)}; tests/scheduling.py)"
        terminalreporter.write_sep("=", title)
        for path, seconds in heaviest:
            terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
        total = sum(self.seconds.values())
        terminalreporter.write_line(f"{total:8.1f}s  all {len(self.seconds)} files, summed over workers")
