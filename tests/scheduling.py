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

The wait lane (`--wait-lane`, which `make test` passes with one xdist worker more than the cores): the
files in `WAIT_LANE_FILES` spend most of their time waiting (the real two-node cluster waits on Slurm's
scheduling, requeues and ssh; alone on a quiet machine its 7 tests took 326 s of wall time at a load
average under 1), so they run on a worker of their own, the last one, beside the one-per-core workers
that share every other file. On 2 cores that file was a third of one worker's time, ~500 s in which the
worker's core sat mostly idle. The lane's worker takes nothing else and stops when its files are done;
the other workers never take its files. Without `--wait-lane` (or with one worker) every file is shared.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

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
    "tests/engine/test_fsdp2.py": 108,
    "tests/tasks/test_task_contract.py": 110,
    "tests/train/test_compile.py": 85,
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


WAIT_LANE_FILES = ("tests/launch/test_cluster.py",)
"""Files that mostly wait rather than compute (module docstring): the wait lane's only work."""


class WaitLaneScheduling(LoadFileScheduling):
    """`--dist loadfile` with the last worker kept for `WAIT_LANE_FILES` (module docstring).

    The workqueue is the files in the order the workers collected them (`order_heaviest_first`); a worker
    asking for work gets the first file of its lane, and a worker whose lane is empty stops. Should the
    lane's worker die (xdist then starts a replacement under a new id), any worker takes its files."""

    def _lane_id(self) -> str:
        return f"gw{self.numnodes - 1}"  # xdist names the workers gw0..gw<n-1>

    def _next_for(self, node) -> str | None:  # type: ignore[no-untyped-def]
        lane = self._lane_id()
        if node.gateway.id != lane and all(n.gateway.id != lane for n in self.nodes):
            return next(iter(self.workqueue), None)  # the lane is gone: share what is left
        waits = node.gateway.id == lane
        return next((scope for scope in self.workqueue if (scope in WAIT_LANE_FILES) == waits), None)

    def _assign_work_unit(self, node) -> None:  # type: ignore[no-untyped-def]
        scope = self._next_for(node)
        if scope is None:  # nothing left in this worker's lane
            if not self._pending_of(self.assigned_work.get(node, {})):
                node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:  # type: ignore[no-untyped-def]
        if node.shutting_down:
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's low-water mark
            return
        self._assign_work_unit(node)


def use_wait_lane(config: pytest.Config) -> bool:
    """`--wait-lane` under `--dist loadfile` with at least 2 workers."""
    workers = getattr(config.option, "numprocesses", None) or 0
    return bool(config.getoption("wait_lane")) and config.getvalue("dist") == "loadfile" and workers >= 2
