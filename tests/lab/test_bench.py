"""`framer-ds bench`: real 2-process runs per strategy, the files and plots they write, a strategy that
cannot run here (ZeRO++ on a CPU) as a row with its reason, the W&B summary run, and scaling across
process counts (from rows, so one launch per strategy is enough here)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, mlp_config
from framer_ds.cli.main import main
from framer_ds.lab.bench import failure_reason, scaling_efficiency, write_bench_files
from framer_ds.lab.bench_rows import BenchRow

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def test_bench_writes_every_file_and_a_failed_strategy_is_a_row(tmp_path, data_cache, monkeypatch, capsys):
    from counter_tool import build_counter

    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))  # the test MLP task, in every launched rank
    # the CPU allocation counter (benchmarks/alloc_counter), preloaded into every rank by the bench
    monkeypatch.setenv("FRAMER_DS_ALLOC_COUNTER", str(build_counter(tmp_path / "counter")))
    monkeypatch.chdir(REPO)
    wandb = {"wandb": {"offline": True, "project": "bench_test"}, "tensorboard": False}
    config = mlp_config(tmp_path / "c.yaml", tmp_path / "run", log=wandb)
    out = tmp_path / "bench"
    argv = ["bench", str(config), "--strategies", "ddp,zeropp", "--nproc", "2", "--steps", "5", "--profile"]
    assert main([*argv, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| strategy | processes |" in printed and "logged the table and plots to W&B" in printed
    assert "memory measured with the allocation counter" in printed

    cells = {c["strategy"]: c for c in json.loads((out / "bench.json").read_text())["cells"]}
    ddp, zeropp = cells["ddp"], cells["zeropp"]
    assert (
        ddp["ok"] and ddp["processes"] == 2 and len(ddp["peak_mib_per_rank"]) == 2 and ddp["s_per_step"] > 0
    )
    assert ddp["samples_per_s"] > 0 and np.isfinite(ddp["final_loss"]) and "eval/loss" in ddp["eval"]
    # On a CPU the table leads with the tensors-only peak (what a GPU and `framer-ds plan` count) and
    # shows the whole process beside it.
    assert 0 < ddp["peak_mib"] < ddp["process_mib"] and "| process MiB/rank |" in printed
    assert len(ddp["traces"]) == 2 and sum(ddp["profile"].values()) > 0  # Chrome traces, time by kind
    assert json.loads(Path(ddp["traces"][0]).read_text())["traceEvents"]
    assert not zeropp["ok"] and "ZeRO++ quantizes with CUDA kernels" in zeropp["error"]
    assert "ChildFailedError" not in zeropp["error"]

    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [(r["strategy"], r["ok"]) for r in rows] == [("ddp", "True"), ("zeropp", "False")]
    markdown = (out / "bench.md").read_text()
    assert "![memory](memory.png)" in markdown and "ZeRO++ quantizes" in markdown and "compute " in markdown
    for name in ("memory", "throughput", "step_time"):
        assert_png_drawn(out / f"{name}.png")
    assert list((out / "wandb").glob("offline-run-*")), "no offline W&B run"


def assert_png_drawn(path: Path) -> None:
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[0] >= 400 and image.shape[1] >= 600, path
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, f"{path.name} is blank"


def test_scaling_efficiency_and_its_plot_across_process_counts(tmp_path):
    """Throughput at N over N x throughput at the fewest; a failed cell is neither a point nor a zero bar."""
    rows = [
        BenchRow("ddp", 1, True, peak_mib_per_rank=[10.0], s_per_step=0.1, samples_per_s=100.0),
        BenchRow("ddp", 2, True, peak_mib_per_rank=[12.0, 12.5], s_per_step=0.125, samples_per_s=160.0),
        BenchRow("zero3", 1, True, peak_mib_per_rank=[8.0], s_per_step=0.2, samples_per_s=50.0),
        BenchRow("zero3", 2, False, error="out of memory"),
    ]
    assert scaling_efficiency(rows) == {("ddp", 1): 1.0, ("ddp", 2): 0.8}
    header = {"config": "c.yaml", "command": "framer-ds bench c.yaml", "machine": "m"}
    files = write_bench_files(rows, tmp_path, header)
    assert [f.name for f in files[3:]] == ["memory.png", "throughput.png", "step_time.png", "scaling.png"]
    for path in files[3:]:
        assert_png_drawn(path)
    assert "| zero3 | 2 | - | - | - | - | - | - | out of memory |" in (tmp_path / "bench.md").read_text()
    assert "process MiB/rank" not in (tmp_path / "bench.md").read_text()  # as on a GPU: one figure
    rows[0].process_mib_per_rank = [30.0]
    write_bench_files(rows, tmp_path, header)
    assert "| ddp | 1 | 10 | 30 | 0.100 |" in (tmp_path / "bench.md").read_text()


def test_failure_reason_names_the_ranks_exception_not_the_launcher():
    stderr = """[rank1]: Traceback (most recent call last):
[rank1]:     raise ValueError("This op had not been implemented on CPU backend.")
[rank1]: ValueError: This op had not been implemented on CPU backend.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  error_file: <N/A>"""
    assert failure_reason(stderr) == "ValueError: This op had not been implemented on CPU backend."
    assert failure_reason("killed\n") == "killed"


def test_bad_bench_flags_are_reported_together(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    argv = ["bench", "configs/quickstart.yaml", "--strategies", "ddp,zero4,zero3", "--nproc", "0,2"]
    assert main([*argv, "--steps", "4", "--profile", "--deepspeed-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "unknown strategy 'zero4'" in err and "--nproc: '0,2'" in err and "5 with --profile" in err
    assert f"{tmp_path / 'zero3.json'} not found" in err


def test_fsdp2_cells_launch_the_fsdp2_yaml_and_need_two_processes(tmp_path, monkeypatch, capsys):
    from framer_ds.lab.bench import launch_args

    args = launch_args("fsdp2", 2, Path("configs/deepspeed"), gpu=False)
    assert args == ["--config_file", "configs/accelerate_fsdp2_cpu_2proc.yaml", "--num_processes", "2"]
    assert launch_args("fsdp2", 8, Path("x"), gpu=True)[1] == "configs/accelerate_fsdp2_8gpu.yaml"
    monkeypatch.chdir(REPO)
    argv = ["bench", "configs/quickstart.yaml", "--strategies", "fsdp2", "--nproc", "1,2"]
    assert main([*argv, "--steps", "3", "--deepspeed-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "fsdp2 needs 2+ processes" in err and "not found" not in err  # no DeepSpeed JSON is needed
