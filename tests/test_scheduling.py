"""tests/scheduling.py: the files it weighs by their measured seconds exist (a renamed file would fall back
to its markers' estimate unnoticed), and a measured file outranks what its markers would say."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import REPO
from scheduling import MEASURED_S, WEIGHT_DISTRIBUTED, WEIGHT_SLOW, order_heaviest_first


def test_every_measured_file_exists():
    assert [path for path in MEASURED_S if not (REPO / path).is_file()] == []


def test_files_start_heaviest_first_by_measured_seconds():
    def item(nodeid: str, *markers: str):
        return SimpleNamespace(
            nodeid=nodeid, get_closest_marker=lambda name: name if name in markers else None
        )

    planner = "tests/lab/test_planner.py"
    # two 2-process tests weigh more by markers than the planner's one slow test, but run for less
    launches = [item(f"tests/x/test_launch.py::t{i}", "slow", "distributed") for i in range(2)]
    assert MEASURED_S[planner] > 2 * (WEIGHT_SLOW + WEIGHT_DISTRIBUTED)
    items = [item("tests/a/test_unit.py::t"), *launches, item(f"{planner}::t", "slow")]
    order_heaviest_first(items)
    assert [i.nodeid.split("::")[0] for i in items] == [
        planner,
        *["tests/x/test_launch.py"] * 2,
        "tests/a/test_unit.py",
    ]


def test_wait_lane_keeps_the_last_worker_for_the_waiting_files(pytester, monkeypatch) -> None:
    """A real `-n 3 --dist loadfile --wait-lane` run: the cluster file runs on the last worker (gw2) and
    nothing else does; the other files are shared by gw0 and gw1. Without --wait-lane, gw2 takes others."""
    pytester.makeconftest(
        f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
from scheduling import WaitLaneScheduling, use_wait_lane

def pytest_addoption(parser):
    parser.addoption("--wait-lane", action="store_true")

def pytest_xdist_make_scheduler(config, log):
    return WaitLaneScheduling(config, log) if use_wait_lane(config) else None
"""
    )
    body = (
        "import os, time\n\ndef test_{i}():\n    time.sleep(0.2)\n"
        "    where = __file__.rsplit('/tests/', 1)[1], os.environ['PYTEST_XDIST_WORKER']\n"
        "    with open(os.environ['RAN_LOG'], 'a') as log:\n"
        "        log.write(' '.join(where) + '\\n')\n"
    )
    files = {"tests/launch/test_cluster.py": 3, **{f"tests/unit/test_u{k}.py": 2 for k in range(6)}}
    for path, count in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(body.replace("{i}", str(i)) for i in range(count)))

    def workers(*flags: str) -> dict[str, set[str]]:
        log = pytester.path / f"ran{len(flags)}.log"
        monkeypatch.setenv("RAN_LOG", str(log))
        result = pytester.runpytest_subprocess(
            "-n", "3", "--dist", "loadfile", "-p", "no:cacheprovider", *flags
        )
        result.assert_outcomes(passed=sum(files.values()))
        ran: dict[str, set[str]] = {}
        for line in log.read_text().splitlines():
            path, worker = line.split()
            ran.setdefault(f"tests/{path}", set()).add(worker)
        return ran

    laned = workers("--wait-lane")
    assert laned.pop("tests/launch/test_cluster.py") == {"gw2"}
    assert set().union(*laned.values()) <= {"gw0", "gw1"} and len(laned) == 6
    shared = workers()
    assert "gw2" in set().union(*(v for k, v in shared.items() if k != "tests/launch/test_cluster.py"))
