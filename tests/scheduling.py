"""How the suite spreads over pytest-xdist workers (`make test` runs `-n <cores> --dist loadgroup`).

Two rules, applied at collection (every worker computes the same order, as xdist requires):

1. Tests that share a module- or class-scoped fixture go to ONE worker (an `xdist_group` named after the
   module): such fixtures are the suite's 2-process reference runs and trained models, and a second
   worker would build its own copy. Every other test is its own unit, so the workers balance.
2. Units start heaviest first (longest-processing-time first): a multi-process or slow test that starts
   last would leave the other worker idle while it runs. The weight is a static estimate from the
   markers (`distributed`, `slow`), not stored timings, so nothing goes stale as tests change.

With one worker (or plain `pytest`) the order is the same and nothing else changes.
"""

from __future__ import annotations

import pytest

# Seconds a test of each kind takes on 2 cores, roughly: only the ranking matters.
WEIGHT_PLAIN, WEIGHT_SLOW, WEIGHT_DISTRIBUTED = 1.0, 40.0, 40.0
SHARED_SCOPES = ("module", "class", "package")


def shared_fixture_scope(item: pytest.Item) -> str | None:
    """The module's node id when `item` uses a fixture that lives longer than one test but not the
    whole session (session fixtures are cheap here or built once per worker by design)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if any(d.scope in SHARED_SCOPES for d in defs):
            return item.nodeid.split("::", 1)[0]
    return None


def item_weight(item: pytest.Item) -> float:
    weight = WEIGHT_PLAIN
    if item.get_closest_marker("slow"):
        weight += WEIGHT_SLOW
    if item.get_closest_marker("distributed"):
        weight += WEIGHT_DISTRIBUTED
    return weight


def group_and_order(items: list[pytest.Item]) -> None:
    """Rules 1 and 2 of the module docstring, in place."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = shared_fixture_scope(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(name=group.replace("/", "_")))
        units.setdefault(group or item.nodeid, []).append(item)
    weight = {key: sum(item_weight(i) for i in unit) for key, unit in units.items()}
    ordered = sorted(units, key=lambda key: -weight[key])  # stable: collection order among equals
    items[:] = [item for key in ordered for item in units[key]]
