"""Run every case of the fault matrix (tests/faults/cases.py) and print case, fault, expected, observed.

    .venv/bin/python scripts/dev/fault_matrix.py                          # from the repository root
    .venv/bin/python scripts/dev/fault_matrix.py --write docs/reliability.md
    .venv/bin/python scripts/dev/fault_matrix.py --single-process-only    # skip the launches (faster)

The suite runs the same cases (tests/faults/test_fault_matrix.py); this prints them as one table, the
one in docs/reliability.md. Exits 1 when any case does not behave as expected.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FRAMER_DS_CACHE", tempfile.mkdtemp(prefix="fault_matrix_cache_"))

from faults.cases import CASES  # noqa: E402  (needs tests/ on the path)

SECTION_START = "<!-- fault matrix: written by scripts/dev/fault_matrix.py -->"
SECTION_END = "<!-- end of fault matrix -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def run_cases(single_process_only: bool) -> tuple[list[tuple[str, str, str, str, bool, float]], float]:
    rows = []
    started = time.perf_counter()
    for case in CASES:
        if single_process_only and case.multi_process:
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"fault_{case.name}_"))
        t0 = time.perf_counter()
        try:
            observed, ok = case.check(workdir), True
        except pytest.skip.Exception as exc:  # a BaseException: the case cannot run here (e.g. no tmpfs)
            observed, ok = f"skipped here: {exc.msg}", None
        except AssertionError as exc:
            observed, ok = (
                f"NOT AS EXPECTED: {str(exc).splitlines()[0] if str(exc) else 'assertion failed'}",
                False,
            )
        except Exception as exc:
            observed, ok = f"NOT AS EXPECTED: {type(exc).__name__}: {exc}", False
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        seconds = time.perf_counter() - t0
        rows.append((case.name, case.fault, case.expected, observed, ok, seconds))
        outcome = {True: "ok  ", False: "FAIL", None: "skip"}[ok]
        print(f"{outcome} {case.name} ({seconds:.1f} s): {observed}", flush=True)
    return rows, time.perf_counter() - started


def render(rows, total_s: float, command: str) -> str:
    passed = sum(ok is True for *_, ok, _ in rows)
    skipped = sum(ok is None for *_, ok, _ in rows)
    lines = [
        SECTION_START,
        f"`{command}` on {platform.node() or 'this machine'} ({os.cpu_count()} cores, "
        f"Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}: **{passed} of {len(rows)} cases "
        f"as expected**{f' ({skipped} could not run here)' if skipped else ''} in {total_s / 60:.1f} min.",
        "",
        "| case | fault injected | expected | observed |",
        "| --- | --- | --- | --- |",
    ]
    for name, fault, expected, observed, ok, _ in rows:
        mark = {True: "", False: "**FAIL** ", None: "**SKIPPED** "}[ok]
        lines.append(f"| `{name}` | {_cell(fault)} | {_cell(expected)} | {mark}{_cell(observed)} |")
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    from framer_ds.storage.atomic import atomic_write_text

    text = path.read_text()
    start, end = text.find(SECTION_START), text.find(SECTION_END)
    if start < 0 or end < 0:
        raise SystemExit(f"{path} has no fault-matrix markers ({SECTION_START} ... {SECTION_END})")
    atomic_write_text(path, text[:start] + section + text[end + len(SECTION_END) + 1 :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--single-process-only", action="store_true", help="skip the multi-process cases")
    parser.add_argument("--write", type=Path, metavar="PATH", help="replace the table in PATH (its markers)")
    args = parser.parse_args(argv)
    rows, total_s = run_cases(args.single_process_only)
    command = "python scripts/dev/fault_matrix.py" + (
        " --single-process-only" if args.single_process_only else ""
    )
    section = render(rows, total_s, command)
    print(section)
    if args.write is not None:
        write_section(args.write, section)
        print(f"wrote the table into {args.write}")
    return 0 if all(ok is not False for *_, ok, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
