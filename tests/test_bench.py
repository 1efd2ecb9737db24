"""`framer-ds bench`: real 1- and 2-process runs per strategy, the files and plots they write, a strategy
that cannot run here (ZeRO++ on a CPU) as a row with its reason, and the W&B summary run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, mlp_config
from framer_ds.cli.main import main
from framer_ds.lab.bench import failure_reason

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def test_bench_writes_every_file_and_a_failed_strategy_is_a_row(tmp_path, data_cache, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))  # the test MLP task, in every launched rank
    monkeypatch.chdir(REPO)
    wandb = {"wandb": {"offline": True, "project": "bench_test"}, "tensorboard": False}
    config = mlp_config(tmp_path / "c.yaml", tmp_path / "run", log=wandb)
    out = tmp_path / "bench"
    argv = ["bench", str(config), "--strategies", "ddp,zeropp", "--nproc", "1,2", "--steps", "5", "--profile"]
    assert main([*argv, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| strategy | processes |" in printed and "logged the table and plots to W&B" in printed

    cells = {
        (c["strategy"], c["processes"]): c for c in json.loads((out / "bench.json").read_text())["cells"]
    }
    for n in (1, 2):
        ddp = cells["ddp", n]
        assert ddp["ok"] and len(ddp["peak_mib_per_rank"]) == n and ddp["s_per_step"] > 0
        assert ddp["samples_per_s"] > 0 and np.isfinite(ddp["final_loss"]) and "eval/loss" in ddp["eval"]
        assert len(ddp["traces"]) == n and sum(ddp["profile"].values()) > 0  # Chrome traces, time by kind
        assert json.loads(Path(ddp["traces"][0]).read_text())["traceEvents"]
        zeropp = cells["zeropp", n]
        assert not zeropp["ok"] and "ZeRO++ quantizes with CUDA kernels" in zeropp["error"]
        assert "ChildFailedError" not in zeropp["error"]
    assert cells["ddp", 1]["scaling_efficiency"] == pytest.approx(1.0)
    assert 0 < cells["ddp", 2]["scaling_efficiency"] < 2

    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert len(rows) == 4 and {r["strategy"] for r in rows} == {"ddp", "zeropp"}
    markdown = (out / "bench.md").read_text()
    assert "![memory](memory.png)" in markdown and "ZeRO++ quantizes" in markdown and "compute " in markdown
    for name in ("memory", "throughput", "step_time", "scaling"):
        image = np.asarray(Image.open(out / f"{name}.png").convert("RGB"))
        assert image.shape[:2] == (450, 800) or image.shape[:2] == (450, 700), name
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, f"{name}.png is blank"
    assert list((out / "wandb").glob("offline-run-*")), "no offline W&B run"


def test_failure_reason_names_the_ranks_exception_not_the_launcher():
    stderr = """[rank1]: Traceback (most recent call last):
[rank1]:     raise ValueError("This op had not been implemented on CPU backend.")
[rank1]: ValueError: This op had not been implemented on CPU backend.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  error_file: <N/A>"""
    assert failure_reason(stderr) == "ValueError: This op had not been implemented on CPU backend."
    assert failure_reason("killed\n") == "killed"
