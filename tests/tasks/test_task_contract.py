"""The contract every built-in task (and every base of one) keeps, checked the same way for each line of
`contract_cases.CASES` (the model: finetrainers' `tests/trainer/test_sft_trainer.py`, one mixin of checks
and one small specification per model):

1. its tiny config validates, and every key of its schema, its `sample` and `export` options is described;
2. 4 optimizer steps run, with a checkpoint at steps 2 and 4 and an export in final/;
3. stopped after the step-2 checkpoint and resumed (`train.resume=latest`, loading in 2 DataLoader
   workers where the uninterrupted run loaded in the main process: a change resume accepts), steps
   3-4 repeat the uninterrupted run's losses and learning rates;
4. the export loaded back (`framer-ds eval`'s `load_export` into the model training builds) scores the
   held-out set exactly as the trained model did at its last evaluation;
5. `framer-ds sample` runs on the export and writes what it says;
6. `framer-ds eval` runs on the export of the resumed run;
7. under umask 022 every file both runs wrote (checkpoints, final/, best/, samples/) is 0644 and every
   directory 0755, as a plain `open()` / `mkdir()` makes them (issue 45: safetensors wrote 0600);
8. every `framer-ds export --format` of the task leaves the files already in its --out folder alone: a
   single-file format (comfyui) adds its file beside them, a directory format refuses the folder in one
   line and writes a new one; every export is 0644 / 0755 under umask 022 (issue 45).

One module-scoped fixture per case trains twice (4 steps straight; a copy cut back to step 2, resumed to
4), in this process through `run_training` as `framer-ds train` calls it; every check reads those runs.

Why the resumed losses must be equal, not close: both runs are fp32 on the CPU and do the same
operations in the same order, so a resumed run that restores the data order, the learning-rate
schedule and every random draw (dropout, augmentation, noise) computes the same floats; a draw or an
order that is not restored moves a loss by far more than any rounding (vit_classification's flips and
crops, drawn from torch's global RNG after the loader had read ahead: 2.2401 against 2.2501 at step 3).
A task that augments draws per item from (seed, epoch, index) (framer_ds/data/item_draws.py), so
neither the read-ahead nor the worker that loads an item changes its draw.

Why the export's metrics must equal the logged ones to float64 rounding (rel 1e-9): `framer-ds eval`
runs the same model class with the same weights (the export holds the trained fp32 tensors), the same
held-out batches in the same order and the same per-sample sums as the run's final evaluation.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import read_metrics, train_in_process, umask, wrong_modes
from contract_cases import AT_THE_END, CASES, ContractCase, run_overrides
from framer_ds.cli.main import main
from framer_ds.config.reference import schema_reference
from framer_ds.engine.export import EXPORT_RECORD
from framer_ds.tasks.config_docs import task_reference
from framer_ds.tasks.registry import BUILTIN_TASKS, get_task_class
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.evaluate_export import evaluate_run
from framer_ds.train.loop import TrainResult

STEPS, CHECKPOINT_EVERY, RESUMED_WORKERS = 4, 2, 2
# The fixture's two trainings and the first check that waits on them share one test's timeout.
RUN_TIMEOUT_S = 900
USER_UMASK = 0o022  # the usual one: files 0644, directories 0755
SINGLE_FILE_FORMATS = ("comfyui",)  # added beside other files; the others write a directory


@dataclass
class ContractRuns:
    """The uninterrupted run and the one resumed from its step-2 checkpoint."""

    straight: Path
    resumed: Path
    result: TrainResult


def train(case: ContractCase, overrides: list[str]) -> TrainResult:
    """`case`'s tiny config with its own overrides, then `overrides`."""
    return train_in_process(case.config, [*case.overrides, *overrides])


def cut_back_to_first_checkpoint(run: Path, to: Path) -> Path:
    """`run` as if it had been stopped right after its first checkpoint."""
    shutil.copytree(run, to)
    for later in range(CHECKPOINT_EVERY * 2, STEPS + 1, CHECKPOINT_EVERY):
        shutil.rmtree(to / "checkpoints" / f"step_{later}")
    shutil.rmtree(to / "final")
    shutil.rmtree(to / "best")  # both exported at step 4, after the cut
    shutil.rmtree(to / "samples", ignore_errors=True)
    return to


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> ContractCase:
    return request.param


@pytest.fixture(scope="module")
def runs(case: ContractCase, tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> ContractRuns:
    root = tmp_path_factory.mktemp(case.name)
    with umask(USER_UMASK):
        result = train(case, run_overrides(STEPS, CHECKPOINT_EVERY, root / "straight"))
        resumed = cut_back_to_first_checkpoint(root / "straight", root / "resumed")
        train(case, run_overrides(STEPS, CHECKPOINT_EVERY, resumed, resume=True, workers=RESUMED_WORKERS))
    return ContractRuns(root / "straight", resumed, result)


def test_every_builtin_task_has_a_case():
    tasks = {load_run_config(case.config).task for case in CASES}
    assert tasks == set(BUILTIN_TASKS), f"add a ContractCase line for {set(BUILTIN_TASKS) - tasks}"


def test_the_tiny_config_validates_and_every_key_is_described(case):
    task = get_task_class(load_run_config(case.config).task)
    rows = task_reference(task.name) + schema_reference(task.sample_options, "sample --")
    if task.export_options is not None:
        rows += schema_reference(task.export_options, "export --")
    missing = [row.key for row in rows if not row.description]
    assert not missing, f"keys without a description (add Field(description=...)): {missing}"


@pytest.mark.slow  # it waits for the fixture's two trainings: 25-100 s a case on 2 busy cores
@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_four_steps_run_and_export(runs):
    assert runs.result.global_step == STEPS
    train_lines, eval_lines = read_metrics(runs.straight)
    assert [line["step"] for line in train_lines] == list(range(1, STEPS + 1))
    assert all(math.isfinite(line["loss"]) for line in train_lines)
    assert [line["step"] for line in eval_lines] == [STEPS]
    checkpoints = sorted(p.name for p in (runs.straight / "checkpoints").iterdir())
    assert checkpoints == [f"step_{s}" for s in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)]
    assert (runs.straight / "final" / EXPORT_RECORD).is_file()


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_resumed_run_repeats_the_uninterrupted_losses(runs):
    straight, again = read_metrics(runs.straight)[0], read_metrics(runs.resumed)[0]
    assert [line["step"] for line in again] == list(range(1, STEPS + 1))  # no line twice after the cut
    resumed_steps = slice(CHECKPOINT_EVERY, STEPS)
    trajectory = [
        [(x["step"], x["loss"], x["lr"]) for x in lines[resumed_steps]] for lines in (again, straight)
    ]
    assert trajectory[0] == trajectory[1]  # exact (module docstring)


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_the_export_loads_back_into_the_trained_model(case, runs):
    """`framer-ds eval` builds the model as training does, loads final/ into it with the task's
    `load_export`, and scores the whole held-out set: the metrics the trained model logged at step 4."""
    logged = read_metrics(runs.straight)[1][-1]
    report = evaluate_run(runs.straight, "final")
    assert report["metrics"] and report["evaluated_examples"] == report["eval_examples"]
    for name, value in report["metrics"].items():
        assert value == pytest.approx(logged[name], rel=1e-9, abs=1e-12), name  # module docstring


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_sample_runs_on_the_export(case, runs, tmp_path, capsys):
    call = case.sample(tmp_path)
    assert main(["sample", str(runs.straight / "final"), *call.args]) == 0, capsys.readouterr().err[-3000:]
    assert capsys.readouterr().out.strip()
    for path in call.writes:
        assert path.is_file() and path.stat().st_size > 0, path


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_eval_runs_on_the_export_of_the_resumed_run(runs, capsys):
    assert main(["eval", str(runs.resumed), "--max-batches", "1"]) == 0, capsys.readouterr().err[-3000:]
    assert "eval.json" in capsys.readouterr().out
    assert (runs.resumed / "eval.json").is_file()


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_every_file_of_the_runs_gets_the_umask_mode(case, runs):
    """Readable by the team and by a server running as another user: 0644 / 0755 under umask 022."""
    for run in (runs.straight, runs.resumed):
        kinds = {"checkpoints", "final", "best", *(["samples"] if AT_THE_END in case.overrides else [])}
        assert kinds <= {p.name for p in run.iterdir()}, sorted(p.name for p in run.iterdir())
        assert wrong_modes(run, USER_UMASK) == [], run


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_every_export_format_leaves_the_files_in_its_out_folder_alone(case, runs, tmp_path, capsys):
    """`--out` holds another LoRA and a note: a single-file format adds its file beside them, a directory
    format refuses the folder in one line (and writes into an empty one); nothing there is deleted or
    replaced (before: the Wan comfyui export deleted them), and every export is 0644 / 0755."""
    final = runs.straight / "final"
    for fmt in case.exports:
        with umask(USER_UMASK):
            out = tmp_path / fmt
            out.mkdir()
            (out / "other_lora.safetensors").write_bytes(b"someone else's weights")
            (out / "readme.txt").write_text("mine\n")
            others = {p.name: p.read_bytes() for p in out.iterdir()}
            rc = main(["export", str(final), "--format", fmt, "--out", str(out)])
            err = capsys.readouterr().err
            if fmt in SINGLE_FILE_FORMATS:
                assert rc == 0, err[-3000:]
                added = sorted({p.name for p in out.iterdir()} - set(others))
                assert len(added) == 1 and added[0].endswith(".safetensors"), added
            else:
                assert rc == 1 and "is not empty" in err and "Traceback" not in err, err[-3000:]
                assert sorted(p.name for p in out.iterdir()) == sorted(others)
                fresh = tmp_path / f"{fmt}_new"
                assert main(["export", str(final), "--format", fmt, "--out", str(fresh)]) == 0
                assert list(fresh.rglob("*.safetensors")) and wrong_modes(fresh, USER_UMASK) == [], fmt
        assert {name: (out / name).read_bytes() for name in others} == others, fmt
        assert wrong_modes(out, USER_UMASK) == [], fmt
