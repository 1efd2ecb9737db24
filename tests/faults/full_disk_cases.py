"""Fault cases: the disk fills up during each write a run or a command makes besides checkpoints
(storage_cases.py has the checkpoint): `final/`, `best/`, a round of samples, a metrics.jsonl line,
eval.json and `framer-ds export`. Each is one line and exit 1 with no traceback, leaves no temporary
file or folder, keeps what was written before, and after space is freed the same command finishes.

The output lies on a small tmpfs (a real file system that really fills up) that the case fills
completely right before the write under test (`filled_before`), in this process: which write meets
the full disk is then certain, not a matter of sizes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from faults.harness import Result, case, cli, mlp, train_steps
from faults.storage_cases import tmpfs

from conftest import read_metrics
from video_adapters import make_adapter

TINY_DISK = "size=16m"


def fill(disk: Path) -> Path:
    """Take every free byte of the file system at `disk` (a tmpfs: page by page) with one file."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as out:
        for chunk in (2**20, 2**12):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError:
                continue
    return filler


def filled_before(
    mp: pytest.MonkeyPatch, owner: type, method: str, disk: Path, when: Callable[..., bool]
) -> None:
    """`owner.method` fills the disk first on the first call for which `when(*args, **kwargs)` holds."""
    original = getattr(owner, method)
    filled: list[Path] = []

    def wrapper(*args, **kwargs):
        if not filled and when(*args, **kwargs):
            filled.append(fill(disk))
        return original(*args, **kwargs)

    mp.setattr(owner, method, wrapper)


def one_line(result: Result, where: Path) -> str:
    """The run's single error line, `no space left on WHERE: ...` (exit 1, no traceback)."""
    errors = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert result.rc == 1 and len(errors) == 1, result.err[-3000:]
    assert errors[0].startswith(f"error: no space left on {where}: "), errors
    assert "Traceback" not in result.err and "RuntimeError" not in result.err
    return errors[0].removeprefix("error: ")


def leftovers(root: Path) -> list[str]:
    """Temporary files and folders of the atomic writers under `root`."""
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.startswith((".tmp_", ".old_")) or ".tmp." in p.name or p.name.endswith(".tmp")
    ]


def _mlp_task():
    from framer_test_tasks import MlpRegressionTask

    return MlpRegressionTask


@case(
    "the disk fills up while final/ is written (output_dir on a tmpfs, full right before the export)",
    "one line 'no space left on <run>: ...; no final/ was written', exit 1; no .tmp_final left, the "
    "last checkpoint verifies, and train.resume=latest writes final/ without training again",
)
def a_full_disk_during_final(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"length.steps": 2, "checkpoint.every.steps": 2})
    with tmpfs(tmp / "disk", TINY_DISK) as disk, pytest.MonkeyPatch.context() as mp:
        run = disk / "run"
        filled_before(mp, _mlp_task(), "export", disk, lambda self, acc, model, out: out.name == ".tmp_final")
        line = one_line(cli("train", str(config), f"output_dir={run}"), run)
        assert "no final/ was written" in line and leftovers(disk) == [] and not (run / "final").exists()
        (disk / "filler").unlink()
        resumed = cli("train", str(config), f"output_dir={run}", "train.resume=latest")
        assert resumed.rc == 0, resumed.err[-3000:]
        assert train_steps(run) == [1, 2] and (run / "final" / "model.safetensors").is_file()
    return f"exit 1: {line.split(';')[0]}; resumed: final/ written, no step trained again"


@case(
    "the disk fills up while best/ is replaced by a better evaluation (step 4; best/ of step 2 exists)",
    "one line naming the run directory ('best/ is kept as it was'), exit 1; best/ still holds step 2 "
    "whole, no .tmp_best; resuming from step_2 replaces it with step 4's",
)
def a_full_disk_during_best(tmp: Path) -> str:
    train = {
        "length.steps": 4,
        "checkpoint.every.steps": 2,
        "eval.every.steps": 2,
        "eval.best_metric": "eval/loss",
        "eval.best_mode": "min",
    }
    config, _ = mlp(tmp, train=train)
    calls: list[Path] = []

    def second_best(self, acc, model, out) -> bool:
        calls.append(out)
        return [p.name for p in calls].count(".tmp_best") == 2

    with tmpfs(tmp / "disk", TINY_DISK) as disk, pytest.MonkeyPatch.context() as mp:
        run = disk / "run"
        filled_before(mp, _mlp_task(), "export", disk, second_best)
        line = one_line(cli("train", str(config), f"output_dir={run}"), run)
        assert "best/ is kept as it was" in line and leftovers(disk) == []
        assert json.loads((run / "best" / "best.json").read_text())["step"] == 2
        assert (run / "best" / "model.safetensors").stat().st_size > 0
        (disk / "filler").unlink()
        resumed = cli("train", str(config), f"output_dir={run}", "train.resume=latest")
        assert resumed.rc == 0, resumed.err[-3000:]
        assert json.loads((run / "best" / "best.json").read_text())["step"] == 4
    return f"exit 1: {line.split(';')[0]}; best/ of step 2 intact; resumed: best/ of step 4"


@case(
    "the disk fills up during the round of samples at step 4 (test_scripted_eval: PNG, GIF, mp4, WAV)",
    "one line naming samples/ ('the samples of earlier steps are kept'), exit 1; samples/step_2 intact, "
    "no partial samples/step_4 or temporary file; the resume writes step_4's",
)
def a_full_disk_during_samples(tmp: Path) -> str:
    from framer_test_tasks import ScriptedEvalTask

    config, _ = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2})
    overrides = ("task=test_scripted_eval", "data.sample_every=2", "data.no_eval_set=true")
    with tmpfs(tmp / "disk", TINY_DISK) as disk, pytest.MonkeyPatch.context() as mp:
        run = disk / "run"
        filled_before(
            mp, ScriptedEvalTask, "write_samples", disk, lambda self, acc, model, step, out: step == 4
        )
        line = one_line(cli("train", str(config), f"output_dir={run}", *overrides), run / "samples")
        assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_2"] and leftovers(disk) == []
        assert len(list((run / "samples" / "step_2").iterdir())) == 4
        (disk / "filler").unlink()
        resumed = cli("train", str(config), f"output_dir={run}", *overrides, "train.resume=latest")
        assert resumed.rc == 0, resumed.err[-3000:]
        assert len(list((run / "samples" / "step_4").iterdir())) == 4
    return f"exit 1: {line.split(';')[0]}; samples/step_2 intact; resumed: samples/step_4 written"


@case(
    "the disk fills up as the metrics.jsonl line of step 3 is appended (a line longer than a page)",
    "one line naming the run directory ('metrics.jsonl is whole up to the line before'), exit 1; no half "
    "line in metrics.jsonl (every line parses); the resume logs steps 3 and 4 once",
)
def a_full_disk_during_a_metrics_line(tmp: Path) -> str:
    from framer_ds.engine.metrics import MetricsLogger

    config, _ = mlp(tmp, train={"length.steps": 4, "checkpoint.every.steps": 2})
    original = MetricsLogger.log

    filled: list[Path] = []

    def log(self, values, step):
        if step == 3 and "loss" in values and not filled:
            filled.append(fill(disk))
            values = {**values, "padding": "x" * 3 * 2**12}  # needs a new page whatever the file's slack
        return original(self, values, step)

    with tmpfs(tmp / "disk", TINY_DISK) as disk, pytest.MonkeyPatch.context() as mp:
        run = disk / "run"
        mp.setattr(MetricsLogger, "log", log)
        line = one_line(cli("train", str(config), f"output_dir={run}"), run)
        assert "metrics.jsonl is whole up to the line before (step 3 was not logged)" in line
        read_metrics(run)  # every line is JSON
        assert train_steps(run) == [1, 2] and leftovers(disk) == []
        (disk / "filler").unlink()
        resumed = cli("train", str(config), f"output_dir={run}", "train.resume=latest")
        assert resumed.rc == 0, resumed.err[-3000:]
        assert train_steps(run) == [1, 2, 3, 4]
    return f"exit 1: {line.split(';')[0]}; metrics.jsonl whole; resumed: steps 3, 4 logged once"


@case(
    "the disk fills up while `framer-ds eval RUN` writes eval.json (an eval.json of an earlier call exists)",
    "one line naming the run directory ('the earlier eval.json is kept'), exit 1; the earlier eval.json "
    "unchanged, no temporary file; with space again the same command writes it",
)
def a_full_disk_during_eval_json(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"length.steps": 2})
    with tmpfs(tmp / "disk", TINY_DISK) as disk:
        run = disk / "run"
        assert cli("train", str(config), f"output_dir={run}", "task=test_phase_recording").rc == 0
        assert cli("eval", str(run)).rc == 0
        before = (run / "eval.json").read_bytes()
        filler = fill(disk)
        line = one_line(cli("eval", str(run)), run)
        assert "the earlier eval.json is kept" in line and leftovers(disk) == []
        assert (run / "eval.json").read_bytes() == before
        filler.unlink()
        assert cli("eval", str(run)).rc == 0
    return f"exit 1: {line.split('. Free')[0]}; eval.json of the earlier call unchanged"


@case(
    "the disk fills up during `framer-ds export RUN/final --format comfyui --out DIR` (safetensors' "
    "Rust writer: 'IoError(Os { code: 28, kind: StorageFull ...'",
    "one line 'no space left on DIR: ...', exit 1; nothing partial beside DIR; with space again the "
    "same command writes it",
)
def a_full_disk_during_an_export(tmp: Path) -> str:
    adapter, svd = make_adapter(tmp)
    with tmpfs(tmp / "disk", TINY_DISK) as disk:
        out = disk / "comfyui"
        argv = ["export", str(adapter), "--format", "comfyui", "--base", str(svd), "--out", str(out)]
        filler = fill(disk)
        line = one_line(cli(*argv), out)
        assert leftovers(disk) == [] and not out.exists()
        filler.unlink()
        again = cli(*argv)
        assert again.rc == 0, again.err[-3000:]
    return f"exit 1: {line.split(';')[0]}; nothing left; the export after freeing space succeeded"
