"""How the suite spreads over pytest-xdist workers (`make test` runs `-n <cores> --dist loadfile
--no-loadscope-reorder`).

Each test file is one unit of work, so a module-scoped fixture (the suite's 2-process reference runs and
trained models) is built once, by the one worker that runs the file. (`--dist loadgroup` with
`xdist_group` marks would balance finer, but pytest-xdist 3.8 marks a group by rewriting `item._nodeid`,
which pytest 9.2 no longer reads: the groups were silently split and such fixtures built on both
workers.)

The files start heaviest first (longest-processing-time first): a file of multi-process tests that
started last would leave the other worker idle while it ran. The weight is a static estimate from the
markers (`distributed`, `slow`), not stored timings, so nothing goes stale as tests change. Within a
file the order is pytest's own. With one worker (or plain `pytest`) only the file order changes.
"""

from __future__ import annotations

import pytest

# Seconds a test of each kind takes on 2 cores, roughly: only the ranking matters. A test on the real
# two-node cluster (`cluster`: several launches, Slurm's requeues) takes 1-5 minutes: without its own
# weight that file ranked 7th and started after files a fifth as long, and ran on alone at the end.
WEIGHT_PLAIN, WEIGHT_SLOW, WEIGHT_DISTRIBUTED, WEIGHT_CLUSTER = 0.2, 40.0, 40.0, 150.0


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
    weight = {path: sum(item_weight(i) for i in tests) for path, tests in files.items()}
    ordered = sorted(files, key=lambda path: -weight[path])  # stable: collection order among equals
    items[:] = [item for path in ordered for item in files[path]]
