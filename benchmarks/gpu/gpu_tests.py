"""Step 1: the `gpu`-marked tests, and on a GPU the CPU suite's single-process strategy and task tests,
which then train on CUDA (framer_ds uses the GPU when there is one). Counts come from pytest's JUnit XML.

The 2-process tests stay on the CPU suite: two ranks cannot share one GPU under NCCL.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ON_CUDA = [
    "tests/test_gpu.py",
    "tests/engine/test_strategy_equivalence.py",
    "tests/tasks/video_lora/svd/test_svd_objective.py",
    "tests/tasks/vit_classification/test_train_vit.py",
    "tests/tasks/tts_lm/test_tts_lm.py",
    "tests/tasks/video_lora/test_video_lora.py",
]


def selections(smoke: bool) -> dict[str, list[str]]:
    import torch

    gpu_marked = {"pytest -m gpu": ["-m", "gpu", *(["tests/test_gpu.py"] if smoke else [])]}
    if smoke or not torch.cuda.is_available():
        return gpu_marked
    return {**gpu_marked, "single-process tests on CUDA": ["-m", "not distributed and not gpu", *ON_CUDA]}


def run_tests(work: Path, smoke: bool) -> list[dict[str, Any]]:
    records = []
    for index, (name, selection) in enumerate(selections(smoke).items()):
        report = work / f"junit_{index}.xml"
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *selection,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        counts = _counts(report)
        ok = done.returncode in (0, 5) and counts["failures"] == 0 and counts["errors"] == 0
        summary = (
            f"{counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']} passed, "
            f"{counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped in "
            f"{time.monotonic() - started:.0f} s"
        )
        record: dict[str, Any] = {"name": name, "ok": ok, "summary": summary, **counts}
        if not ok:
            failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
            record["error"] = f"{summary}: {'; '.join(failed)[:500] or done.stdout[-500:]}"
        records.append(record)
    return records


def _counts(report: Path) -> dict[str, int]:
    if not report.is_file():
        return {"tests": 0, "failures": 0, "errors": 1, "skipped": 0}
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
