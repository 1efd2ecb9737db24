"""Every case of the fault matrix (tests/faults/cases.py) as a test; `scripts/dev/fault_matrix.py`
prints the same cases as the table in docs/reliability.md."""

from __future__ import annotations

import pytest
from faults.cases import CASES


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "fault_case",
    [pytest.param(c, id=c.name, marks=[pytest.mark.distributed] if c.multi_process else []) for c in CASES],
)
def test_fault(fault_case, tmp_path):
    observed = fault_case.check(tmp_path)
    assert observed
