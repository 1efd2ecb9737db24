"""The GPU suite (benchmarks/gpu/) proves itself on a CPU: every step measured (its launches stubbed in the
default suite; `run.sh --smoke` trains them at tiny sizes under `make test-gpu-suite`), one JSON line per
measurement and the markdown table; a failing step is a row; and it installs only the carried wheels a
machine lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO

GPU_BENCH = REPO / "benchmarks" / "gpu"
STUB = Path(__file__).with_name("gpu_suite_stub.py")
STEPS = ("tests", "video_lora", "vit_overhead", "tts_lm", "drivable_vit", "nonfinite_check")


def assert_every_step_measured(out: Path) -> None:
    """What a `--smoke --strict` run of every step leaves in `out`: a record per measurement, all ok,
    with the figures each step reports, and the smoke table with a row per step."""
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == set(STEPS)
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    trainings = [r for r in records if r["step"] in ("video_lora", "tts_lm", "drivable_vit")]
    # every measured training has its peak, its speed and the plan's prediction beside it (step 6)
    assert trainings and all(r["peak_gib"] > 0 and r["s_per_step"] > 0 for r in trainings)
    assert all(r["predicted_gib"] > 0 and "plan_error" in r for r in trainings)
    assert {r["name"].rsplit("/ ", 1)[-1] for r in records if r["step"] == "tts_lm"} == {"pack", "pad"}
    assert all(r["tokens_per_s"] > 0 for r in records if r["step"] == "tts_lm")
    (overhead,) = [r for r in records if r["step"] == "vit_overhead"]
    assert overhead["hand_loop_samples_per_s"] > 0 and overhead["overhead_ratio"] > 0
    (check,) = [r for r in records if r["step"] == "nonfinite_check"]
    assert check["s_per_step"] > 0 and check["s_per_step_without_check"] > 0
    table = (out / "gpu_suite.md").read_text()
    assert table.startswith("## GPU suite") and "no figure here is a GPU figure" in table
    assert all(f"| {step} |" in table for step in STEPS)


def test_every_step_is_measured_and_the_table_written(tmp_path: Path, monkeypatch, tiny_tts) -> None:
    """The suite's driver and every step's own code, each step in its own process under its limit, with
    the launches and trainings that give the figures stubbed (tests/lab/gpu_suite_stub.py: a cell's
    config and overrides are still loaded as its launch loads them). run.sh reaches the suite. `tiny_tts`:
    the tts_lm cells' tokenizer, the session's (built once for every tts test)."""
    via_run_sh = subprocess.run(
        ["bash", str(GPU_BENCH / "run.sh"), "--only", "nope"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    assert via_run_sh.returncode == 2 and "unknown step(s) nope" in via_run_sh.stderr
    monkeypatch.syspath_prepend(str(GPU_BENCH))
    import suite

    out = tmp_path / "suite"
    monkeypatch.setattr(suite, "STEP_SCRIPT", STUB)
    monkeypatch.setattr(sys, "argv", ["suite.py", "--smoke", "--strict", "--out", str(out)])
    assert suite.main() == 0
    assert_every_step_measured(out)


@pytest.mark.gpu_suite_full
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_smoke_run_measures_every_step_and_writes_the_table(tmp_path: Path) -> None:
    """The real `run.sh --smoke`: every step trains at tiny sizes on this CPU (minutes; `make
    test-gpu-suite`, not in the default suite, which runs the stubbed twin above)."""
    out = tmp_path / "suite"
    done = subprocess.run(
        ["bash", str(GPU_BENCH / "run.sh"), "--smoke", "--strict", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_every_step_measured(out)


def test_a_step_that_fails_is_a_row_and_strict_fails_the_run(tmp_path: Path) -> None:
    """An unknown step is refused up front; a step whose process dies is a FAILED row, not a crash."""
    run = [sys.executable, str(GPU_BENCH / "suite.py"), "--smoke", "--out", str(tmp_path)]
    refused = subprocess.run([*run, "--only", "tests,nope"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "unknown step(s) nope" in refused.stderr
    env = {**os.environ, "PYTHONPATH": str(REPO), "FRAMER_DS_GPU_SUITE_FAIL": "tests"}
    failed = subprocess.run(
        [*run, "--only", "tests", "--strict"], env=env, capture_output=True, text=True, check=False
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (record,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert record["step"] == "tests" and not record["ok"] and record["error"].startswith("exit 1")
    assert "| tests | - |" in (tmp_path / "gpu_suite.md").read_text()


def test_install_wheels_skips_what_the_machine_has(tmp_path: Path) -> None:
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name in ("PyYAML-6.0-py3-none-any.whl", "framer_missing_pkg-1.0-py3-none-any.whl"):
        with zipfile.ZipFile(wheels / name, "w") as wheel:
            dist = name.split("-")[0]
            wheel.writestr(
                f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
            )
            wheel.writestr(
                f"{dist}-1.0.dist-info/WHEEL",
                "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            wheel.writestr(f"{dist}-1.0.dist-info/RECORD", "")
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, str(GPU_BENCH / "install_wheels.py"), str(wheels), str(target)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "installed framer-missing-pkg into" in done.stdout  # pyyaml is in the venv: left alone
    assert (target / "framer_missing_pkg-1.0.dist-info").is_dir()
    again = subprocess.run(
        [sys.executable, str(GPU_BENCH / "install_wheels.py"), str(wheels), str(target)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "installed nothing" in again.stdout


def test_a_step_keeps_the_cells_it_measured_before_it_dies(tmp_path: Path, monkeypatch) -> None:
    """A step stopped at its limit (or by the end of a device lease) keeps its finished cells: on an H200
    (2026-11-26) a step killed after 7 of 9 cells lost all 7, because records were written at its end."""
    monkeypatch.syspath_prepend(str(GPU_BENCH))
    import cells
    import suite

    def measure(cell, out_dir, port, steps):
        if cell.name == "second":
            raise SystemExit("killed at the step's limit")
        return {"name": cell.name, "ok": True}

    two = [SimpleNamespace(name=name, smoke=False) for name in ("first", "second")]
    monkeypatch.setitem(cells.CELLS, "video_lora", lambda work, smoke: two)
    monkeypatch.setattr(cells, "measure_cell", measure)
    results = tmp_path / "results.jsonl"
    with pytest.raises(SystemExit):
        suite.run_one_step("video_lora", tmp_path / "work", False, results)
    assert [json.loads(line) for line in results.read_text().splitlines()] == [
        {"step": "video_lora", "name": "first", "ok": True}
    ]
