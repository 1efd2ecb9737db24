"""The run summary at start, and cadences in epochs: the same config means the same thing on 1 and 2
processes (the summary's numbers follow the launch; evaluations land at the same points of an epoch)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import (
    REPO,
    TINY_VIT_OVERRIDES,
    accelerate_launch_cmd,
    launch_env,
    read_metrics,
    reset_accelerate,
)
from framer_ds.cli.main import main

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")
# One epoch of the digits (1,437 training images) at micro-batch 16, accumulation 2, evaluating every
# half epoch: 45 optimizer steps per epoch on 1 process, 22 on 2.
EPOCH_OVERRIDES = [
    *TINY_VIT_OVERRIDES,
    "train.gradient_accumulation_steps=2",
    "train.eval.every.epochs=0.5",
    "train.lr_schedule.warmup.fraction=0.1",
]


def summary_of(run_dir: Path) -> dict:
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return first["run_summary"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("one") / "run"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", QUICKSTART, f"output_dir={run_dir}", *EPOCH_OVERRIDES]) == 0
    reset_accelerate()  # trained through the CLI in this process: the tests read what it printed
    return run_dir, out.getvalue()


def test_the_summary_says_what_runs(one_process):
    run_dir, out = one_process
    assert "***** Running training *****" in out and "global batch" in out
    summary = summary_of(run_dir)
    assert summary["train examples"] == 1437 and summary["eval examples"] == 360
    assert summary["validation"] == "val/"
    assert summary["processes"] == 1 and summary["global batch"] == 32
    assert summary["optimizer steps per epoch"] == 45 and summary["total optimizer steps"] == 45
    assert summary["warmup steps"] == 5  # ceil(10% of 45)
    assert summary["evaluate"] == "every 0.5 epochs (about 22.5 steps)"
    assert summary["strategy"] == "single CPU process"
    assert summary["trainable parameters"] == summary["total parameters"] > 100_000
    assert summary["start"] == "step 0 (new run)"
    assert summary["torch.compile"] == "off (train.compile: false)"
    assert summary["frozen base"] == "full precision (model.base_precision: full)"
    assert "frozen helpers" not in summary  # the ViT has none


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_two_processes_evaluate_at_the_same_points_of_the_epoch(one_process, tmp_path):
    run_dir = tmp_path / "run"
    cmd = accelerate_launch_cmd(
        "--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", QUICKSTART, f"output_dir={run_dir}"
    )
    proc = subprocess.run(
        [*cmd, *EPOCH_OVERRIDES], cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("***** Running training *****") == 1  # rank 0 only
    summary = summary_of(run_dir)
    assert summary["processes"] == 2 and summary["global batch"] == 64
    assert summary["optimizer steps per epoch"] == 22 and summary["strategy"] == "DDP on 2 CPU processes"
    assert summary["trainable parameters"] == summary_of(one_process[0])["trainable parameters"]

    def eval_epochs(run: Path) -> list[float]:
        train_lines, eval_lines = read_metrics(run)
        epoch_at = {line["step"]: line["epoch"] for line in train_lines}
        return [epoch_at[line["step"]] for line in eval_lines]

    one, two = eval_epochs(one_process[0]), eval_epochs(run_dir)
    assert len(one) == len(two) == 2
    for a, b in zip(one, two, strict=True):
        assert a == pytest.approx(b, abs=1 / 22)  # within one optimizer step of each other
    assert one[0] >= 0.5 and two[0] >= 0.5  # on the step that completes half the epoch, never before
