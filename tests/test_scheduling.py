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
