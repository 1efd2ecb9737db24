"""The allocation counter, a benchmark tool outside the package (benchmarks/alloc_counter), for the tests
that measure CPU memory with it: built once per test module into a temporary folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import REPO

TOOL = REPO / "benchmarks" / "alloc_counter" / "alloc_counter.py"


def build_counter(cache_dir: Path) -> Path:
    """The compiled counter library (needs a C compiler, as the CPU benchmarks do)."""
    spec = importlib.util.spec_from_file_location("alloc_counter_tool", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.build_alloc_counter(cache_dir)
