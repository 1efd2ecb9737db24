"""`framer-ds report`: curves and a table from a real run directory, from its job log alone, and from a
requeued job's logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO
from framer_ds.cli.main import main
from framer_ds.config.errors import ConfigError
from framer_ds.lab.report import default_report_dir, read_history, summary_row

STEPS = 12


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, data_cache) -> Path:
    """A quickstart run whose stdout and stderr went to logs/job-1.out, as under sbatch --output."""
    root = tmp_path_factory.mktemp("report")
    (root / "logs").mkdir()
    overrides = [
        f"output_dir={root / 'run'}", f"train.length.steps={STEPS}", "train.eval.every.steps=6",
        "train.log_every=2",
        "train.checkpoint.every=null", "train.micro_batch_size=16",
        "train.eval.max_batches=4",
    ]  # fmt: skip
    with (root / "logs" / "job-1.out").open("w") as log:
        command = [sys.executable, "-m", "framer_ds", "train", "configs/quickstart.yaml", *overrides]
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=300)
    return root


def assert_png_drawn(path: Path) -> None:
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[0] >= 300 and image.shape[1] >= 500, path
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, f"{path} is blank"


def test_report_from_metrics_and_from_the_job_log_agree(logged_run, tmp_path, capsys):
    assert (
        main(
            [
                "report",
                str(logged_run / "run"),
                str(logged_run / "logs" / "job-1.out"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| run | strategy | steps |" in out and "wrote" in out
    for name in ("loss", "lr", "samples_per_s", "memory_rss_gb", "eval_loss", "eval_accuracy"):
        assert_png_drawn(tmp_path / f"{name}.png")
    report = (tmp_path / "report.md").read_text()
    assert "![loss](loss.png)" in report and report.count("\n| ") == 3  # header + two runs

    from_metrics, from_log = read_history(logged_run / "run"), read_history(logged_run / "logs" / "job-1.out")
    assert [x["step"] for x in from_metrics.evals] == [x["step"] for x in from_log.evals] == [6, 12]
    for logged, printed in zip(from_metrics.evals, from_log.evals, strict=True):
        assert printed["eval/loss"] == pytest.approx(logged["eval/loss"], abs=1e-4)
    rows = summary_row(from_metrics), summary_row(from_log)
    assert rows[0]["steps"] == rows[1]["steps"] == STEPS
    assert rows[0]["final_loss"] == pytest.approx(rows[1]["final_loss"], abs=1e-4)
    assert rows[0]["time_s"] > 0 and rows[0]["samples_per_s"] > 0 and rows[0]["peak_memory_gb"] > 0
    assert rows[0]["best eval/loss"] <= rows[0]["final eval/loss"]


def test_the_report_goes_into_the_run_not_the_current_directory(logged_run, tmp_path, monkeypatch, capsys):
    """Without --out: RUN/report/ (a job log: its run's report/), several runs: report/ beside them."""
    monkeypatch.chdir(tmp_path)
    run = logged_run / "run"
    assert main(["report", str(run)]) == 0
    assert (run / "report" / "report.md").is_file() and (run / "report" / "loss.png").is_file()
    assert f"wrote {run / 'report' / 'report.md'}" in capsys.readouterr().out
    assert not (tmp_path / "report").exists()
    assert default_report_dir([logged_run / "logs" / "job-1.out"]) == logged_run.resolve() / "report"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert default_report_dir([tmp_path / "a", Path("b")]) == tmp_path.resolve() / "report"


def test_requeued_logs_killed_lines_and_damaged_files(tmp_path):
    """A job requeued after a kill: two logs, the second resuming; the later steps replace the earlier."""
    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    bar = "train:  {p}%|#   | {s}/40 [00:{t:02d}<00:30,  2.00it/s, loss={loss}]"
    first = "\r".join(bar.format(p=s * 2, s=s, t=s, loss=f"{5 - s / 10:.4f}") for s in (2, 4, 6, 8))
    (logs / "job-1.out").write_text(first + "\nstep 5: eval/loss=4.5000, eval/accuracy=0.1000\n")
    second = "\r".join(bar.format(p=s * 2, s=s, t=s, loss=f"{5 - s / 10:.4f}") for s in (6, 10, 12))
    (logs / "job-2.out").write_text(
        "resumed from x at step 5\n" + second + "\nstep 10: eval/loss=nan, eval/accuracy=0.2\n"
    )
    history = read_history(tmp_path / "job")
    assert [x["step"] for x in history.train] == [2, 4, 6, 10, 12]
    assert history.train[-1]["loss"] == pytest.approx(3.8) and history.train[-1]["steps_per_s"] == 2.0
    row = summary_row(history)
    assert row["best eval/accuracy"] == 0.2 and row["final eval/loss"] == 4.5  # a NaN eval is not a value
    assert row["time_s"] == 12

    run = tmp_path / "killed"
    run.mkdir()
    lines = [{"step": 0, "run_summary": {"strategy": "DDP"}}, {"step": 1, "time": 10.0, "loss": 2.0}]
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + '\n{"step": 2, "lo')
    assert summary_row(read_history(run))["strategy"] == "DDP"
    (run / "metrics.jsonl").write_text('{"step": 1, "lo\n' + json.dumps(lines[1]) + "\n")
    with pytest.raises(ConfigError, match=r"metrics.jsonl:1: not JSON"):
        read_history(run)
    with pytest.raises(ConfigError, match=r"no metrics\.jsonl, no logs"):
        read_history(tmp_path / "logs_elsewhere")


def test_peak_memory_prefers_what_a_gpu_counts():
    """A GPU's allocator, else the CPU tensor counter's figure, else the process RSS: the row's peak is
    the one `framer-ds plan` models whenever the run logged it."""
    from framer_ds.lab.report import RunHistory

    line = {"step": 1, "loss": 1.0, "memory/rss_gb": 3.0, "memory/max_tensor_allocated_gb": 1.5}
    cpu = RunHistory(
        "cpu", Path("."), train=[line, {**line, "step": 2, "memory/max_tensor_allocated_gb": 2.0}]
    )
    assert summary_row(cpu)["peak_memory_gb"] == 2.0
    gpu = RunHistory("gpu", Path("."), train=[{**line, "memory/max_allocated_gb": 0.5}])
    assert summary_row(gpu)["peak_memory_gb"] == 0.5
    bare = RunHistory("rss", Path("."), train=[{"step": 1, "loss": 1.0, "memory/rss_gb": 3.0}])
    assert summary_row(bare)["peak_memory_gb"] == 3.0


def test_every_bar_print_of_a_logged_step_shows_that_steps_loss(tmp_path, monkeypatch, quickstart_overrides):
    """The bar printed a step before the log action set that step's loss, so a job log showed the loss
    logged one interval earlier; under load (every step slower than the bar's 0.5 s) the report's final
    loss from a job log then differed from metrics.jsonl's. Here the bar prints every step, as under load."""
    from tqdm.auto import tqdm

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train import loop

    log_path = tmp_path / "job.out"
    with log_path.open("w") as log:
        monkeypatch.setattr(loop, "tqdm", lambda **kw: tqdm(**{**kw, "mininterval": 0, "file": log}))
        overrides = [*quickstart_overrides, "train.length.steps=6", "train.log_every=2"]
        loop.run_training(load_run_config(REPO / "configs" / "quickstart.yaml", overrides))
    logged = {x["step"]: x["loss"] for x in read_history(tmp_path / "run").train}
    printed = {x["step"]: x["loss"] for x in read_history(log_path).train}
    assert sorted(logged) == [2, 4, 6]
    for step, loss in logged.items():  # the bar shows 4 decimals
        assert printed[step] == pytest.approx(loss, abs=5e-5), (step, printed, logged)
