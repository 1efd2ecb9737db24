"""train.eval.best_metric: best/ holds the task's export at the best evaluation so far, best.json says which,
and the best value travels in every checkpoint so a resumed run never replaces best/ with a worse model.
The checkpoint of the best evaluation is kept beside keep_last's and `train.resume=best` resumes it (the
same after a divergence: the fault case `divergence_after_the_best_keeps_and_names_it`).

The test task's eval/score is scripted per evaluation (tests/framer_test_tasks.py, test_scripted_eval)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from faults.harness import cli
from safetensors.torch import load_file

from conftest import read_metrics, set_keys, train_in_process
from framer_ds.config.errors import ConfigError
from framer_ds.engine.checkpoint import STATE_FILE, TrainerState, checkpoints_to_prune, read_trainer_state
from framer_ds.engine.resume.changes import resume_changes
from framer_ds.tasks.run_config import load_exported_task, load_run_config
from framer_ds.train.actions import KeepBest


def scripted_config(tmp_path: Path, name: str, script: list[float], **sections: dict) -> Path:
    """A YAML for test_scripted_eval: evaluating and checkpointing every 2 steps, every checkpoint kept;
    `sections` set dotted keys on top (conftest.set_keys)."""
    config = {
        "imports": ["framer_test_tasks"],
        "task": "test_scripted_eval",
        "output_dir": str(tmp_path / "run"),
        "model": {"width": 32, "depth": 2},
        "data": {"num_samples": 128, "eval_samples": 16, "dim": 8, "eval_script": script},
        "train": {
            "seed": 7,
            "length": {"steps": 8},
            "micro_batch_size": 8,
            "optimizer": {"learning_rate": 1e-2},
            "eval": {"every": {"steps": 2}},
            "checkpoint": {"every": {"steps": 2}, "keep_last": 8},
        },
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(set_keys(config, **sections)))
    return path


def best_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "best" / "best.json").read_text())


def assert_same_weights(a: Path, b: Path) -> None:
    left, right = load_file(a), load_file(b)
    assert left.keys() == right.keys()
    assert all(torch.equal(left[k], right[k]) for k in left)


@pytest.mark.parametrize(("mode", "best_step"), [("max", 6), ("min", 4)])
def test_best_follows_the_metric(tmp_path, mode, best_step):
    script = [0.5, 0.3, 0.9, 0.4]  # evaluations at steps 2, 4, 6, 8
    config = scripted_config(
        tmp_path, "c.yaml", script, train={"eval.best_metric": "eval/score", "eval.best_mode": mode}
    )
    train_in_process(config)
    run_dir = tmp_path / "run"
    value = script[best_step // 2 - 1]
    assert best_record(run_dir) == {"step": best_step, "metric": "eval/score", "value": value, "mode": mode}
    # best/ is the model as it was at that step: the same weights as the checkpoint written there.
    best_weights = run_dir / "best" / "model.safetensors"
    assert_same_weights(best_weights, run_dir / "checkpoints" / f"step_{best_step}" / "model.safetensors")
    assert load_file(best_weights).keys() == load_file(run_dir / "final" / "model.safetensors").keys()
    assert not torch.equal(
        *(load_file(p)["net.0.weight"] for p in (best_weights, run_dir / "final" / "model.safetensors"))
    )
    # The best so far after every evaluation, next to the eval lines.
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best_curve = [(x["step"], x["best/eval/score"]) for x in lines if "best/eval/score" in x]
    expected = [script[0]]
    for v in script[1:]:
        expected.append(max(expected[-1], v) if mode == "max" else min(expected[-1], v))
    assert best_curve == list(zip([2, 4, 6, 8], expected, strict=True))
    # The checkpoint after the best carries it.
    state = read_trainer_state(run_dir / "checkpoints" / "step_8")
    assert (state.best_metric, state.best_mode, state.best_value, state.best_step) == (
        "eval/score",
        mode,
        value,
        best_step,
    )
    assert not list(run_dir.glob(".tmp_*")) and not list(run_dir.glob(".old_*"))


def test_best_loads_as_the_tasks_export(tmp_path):
    config = scripted_config(
        tmp_path,
        "c.yaml",
        [1.0],
        train={
            "eval.best_metric": "eval/loss",
            "eval.best_mode": "min",
            "length.steps": 2,
            "checkpoint.every": None,
        },
    )
    train_in_process(config)
    best = tmp_path / "run" / "best"
    task = load_exported_task(best)  # the export record names the task and its config
    assert task.name == "test_scripted_eval"
    model = task.build_model()
    model.load_state_dict(load_file(best / "model.safetensors"))
    assert best_record(tmp_path / "run")["metric"] == "eval/loss"


def test_best_survives_resume(tmp_path):
    """The resumed run compares with the best stored in the checkpoint: its evaluations at steps 6 (worse)
    and 8 (equal: not strictly better) leave best/ as step 4 wrote it. Without the stored value step 6
    would be the resumed run's first evaluation and replace it."""
    config = scripted_config(
        tmp_path, "c.yaml", [0.5, 0.3], train={"eval.best_metric": "eval/score", "eval.best_mode": "min"}
    )
    train_in_process(config, ["train.length.steps=4"])
    run_dir = tmp_path / "run"
    assert best_record(run_dir)["step"] == 4
    before = load_file(run_dir / "best" / "model.safetensors")

    train_in_process(config, ["train.resume=latest"])
    assert best_record(run_dir) == {"step": 4, "metric": "eval/score", "value": 0.3, "mode": "min"}
    after = load_file(run_dir / "best" / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)
    summary = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])  # lines up to step 4 kept
    first_of_resume = [
        json.loads(x)["run_summary"]
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "run_summary" in json.loads(x)
    ][-1]
    assert summary["run_summary"]["keep best"] == "best/ at the lowest eval/score"
    assert first_of_resume["keep best"] == "best/ at the lowest eval/score (so far 0.3 at step 4)"
    assert read_trainer_state(run_dir / "checkpoints" / "step_8").best_step == 4
    _, evals = read_metrics(run_dir)
    assert [x["step"] for x in evals] == [2, 4, 6, 8]

    # Judged by another mode on resume: the change is listed, and the stored best no longer counts.
    changed = load_run_config(config, ["train.eval.best_mode=max", "train.resume=latest"])
    state = read_trainer_state(run_dir / "checkpoints" / "step_8")
    lines = resume_changes(run_dir / "checkpoints" / "step_8", changed, state, 1)
    assert any(
        line.startswith("train.eval.best_mode: 'min' -> 'max'") and "replaced" in line for line in lines
    )
    state.forget_best_unless("eval/score", "max")
    assert state.best_value is None and state.best_step is None


def test_resuming_from_before_best_sets_it_aside_with_the_abandoned_timeline(tmp_path):
    """best/ exported at step 6, resumed from step 4: that best/ belongs to the abandoned timeline. Left in
    place it would stay (stale, better than anything stored) while the state holds step 4's value."""
    config = scripted_config(
        tmp_path,
        "c.yaml",
        [0.5, 0.3, 0.1, 0.4],
        train={"eval.best_metric": "eval/score", "eval.best_mode": "min"},
    )
    train_in_process(config)
    run_dir = tmp_path / "run"
    assert best_record(run_dir)["step"] == 6
    train_in_process(config, [f"train.resume={run_dir / 'checkpoints' / 'step_4'}"])
    (abandoned,) = (run_dir / "checkpoints" / "abandoned").iterdir()
    assert json.loads((abandoned / "best" / "best.json").read_text())["value"] == 0.1
    # the new timeline's evaluations (this process's script restarts: 0.5 at step 6, 0.3 at step 8)
    assert best_record(run_dir) == {"step": 8, "metric": "eval/score", "value": 0.3, "mode": "min"}
    assert_same_weights(
        run_dir / "best" / "model.safetensors", run_dir / "checkpoints" / "step_8" / "model.safetensors"
    )


def test_a_checkpoint_from_before_best_tracking_loads(tmp_path):
    old = {"global_step": 6, "epoch": 0, "batches_in_epoch": 6, "samples_seen": 48, "world_size": 1}
    (tmp_path / STATE_FILE).write_text(json.dumps(old))
    state = read_trainer_state(tmp_path)
    assert state.global_step == 6 and state.best_value is None and state.best_metric is None


def test_best_metric_without_an_eval_set_is_a_config_error(tmp_path):
    config = scripted_config(
        tmp_path, "c.yaml", [], train={"eval.best_metric": "eval/loss", "eval.best_mode": "min"}
    )
    with pytest.raises(ConfigError) as raised:
        train_in_process(config, ["data.no_eval_set=true"])
    problem = raised.value.problems[0]
    assert problem.where == "train.eval.best_metric" and "no eval set" in problem.message
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before training


def test_a_metric_the_task_does_not_report_fails_naming_those_it_does(tmp_path):
    config = scripted_config(
        tmp_path, "c.yaml", [0.1], train={"eval.best_metric": "eval/iou", "eval.best_mode": "max"}
    )
    with pytest.raises(ConfigError) as raised:
        train_in_process(config, ["train.length.steps=2"])
    message = str(raised.value)
    assert "train.eval.best_metric" in message and "'eval/iou'" in message
    assert "eval/loss, eval/score" in message
    assert not (tmp_path / "run" / "best").exists()


@pytest.mark.parametrize(
    ("overrides", "where", "words"),
    [
        (
            ["train.eval.best_metric=iou", "train.eval.best_mode=max"],
            "train.eval.best_metric",
            "write 'eval/iou'",
        ),
        (
            ["train.eval.best_metric=eval/loss", "train.eval.best_mode=highest"],
            "train.eval.best_mode",
            "'max' or 'min'",
        ),
        (["train.eval.best_metric=eval/loss"], "train.eval.best_mode", "set best_mode to max"),
        (["train.eval.best_mode=min"], "train.eval.best_mode", "no effect without best_metric"),
    ],
)
def test_best_config_errors(tmp_path, overrides, where, words):
    config = scripted_config(tmp_path, "c.yaml", [])
    with pytest.raises(ConfigError) as raised:
        load_run_config(config, overrides)
    assert [p.where for p in raised.value.problems] == [where]
    assert words in raised.value.problems[0].message


@pytest.mark.parametrize(
    ("mode", "value", "best", "improves"),
    [
        ("max", 0.5, None, True),
        ("max", 0.6, 0.5, True),
        ("max", 0.5, 0.5, False),
        ("min", 0.4, 0.5, True),
        ("min", 0.6, 0.5, False),
        ("min", math.nan, None, False),
        ("max", math.inf, 0.5, False),
    ],
)
def test_strictly_better_and_never_a_non_finite_value(mode, value, best, improves):
    assert KeepBest("eval/x", mode).improves(value, best) is improves


def test_trainer_state_keeps_its_best_only_for_the_same_metric_and_mode():
    state = TrainerState(best_metric="eval/loss", best_mode="min", best_value=0.2, best_step=4)
    state.forget_best_unless("eval/loss", "min")
    assert state.best_value == 0.2
    state.forget_best_unless("eval/accuracy", "max")
    assert (state.best_metric, state.best_mode, state.best_value, state.best_step) == (
        "eval/accuracy",
        "max",
        None,
        None,
    )


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted((p.name for p in (run_dir / "checkpoints").glob("step_*")), key=lambda n: int(n[5:]))


@pytest.mark.parametrize(
    ("best_step", "pruned"),
    [(None, [2, 4, 6]), (4, [2, 6]), (5, [2, 6]), (8, [2, 4, 6]), (1, [2, 4, 6])],
)
def test_pruning_keeps_the_best_checkpoint_beside_the_newest(tmp_path, best_step, pruned):
    """keep_last=2 of step_2..step_10: the newest two, plus the newest checkpoint at or before the best
    evaluation (step 4 for an evaluation at step 4 or 5); none when best/ is missing or older than all."""
    for step in (2, 4, 6, 8, 10):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step}" / STATE_FILE).write_text("{}")
    if best_step is not None:
        (tmp_path / "best").mkdir()
        record = {"step": best_step, "metric": "eval/loss", "value": 0.1, "mode": "min"}
        (tmp_path / "best" / "best.json").write_text(json.dumps(record))
    assert checkpoints_to_prune(tmp_path, 2) == [tmp_path / "checkpoints" / f"step_{s}" for s in pruned]


def test_the_best_checkpoint_survives_keep_last_and_resume_best_rolls_back_to_it(tmp_path):
    """Evaluations every 2 steps, checkpoints every 4, keep_last=1: the best evaluation is at step 6, so
    the best checkpoint is step_4 (the newest before it; the same config retrains step 6 from it). Today
    keep_last deleted it at step 8. train.resume=best continues from it: the losses after step 4 are the
    first run's, and step_8, final/ and best/ (exported at step 6, after the resume point) move to the
    abandoned timeline."""
    config = scripted_config(
        tmp_path,
        "c.yaml",
        [0.5, 0.3, 0.1, 0.4],
        train={
            "eval.best_metric": "eval/score",
            "eval.best_mode": "min",
            "checkpoint.every.steps": 4,
            "checkpoint.keep_last": 1,
        },
    )
    train_in_process(config)
    run_dir = tmp_path / "run"
    assert best_record(run_dir)["step"] == 6
    assert checkpoint_names(run_dir) == ["step_4", "step_8"]
    first = {x["step"]: x["loss"] for x in read_metrics(run_dir)[0]}

    result = train_in_process(config, ["train.resume=best"])
    assert result.global_step == 8
    (abandoned,) = (run_dir / "checkpoints" / "abandoned").iterdir()
    assert abandoned.name.endswith("_from_step_4")
    assert sorted(p.name for p in abandoned.iterdir()) == ["best", "final", "step_8"]
    again = {x["step"]: x["loss"] for x in read_metrics(run_dir)[0]}
    assert again == first  # steps 1-4 kept from the first run, 5-8 retrained exactly (same config)


def test_resume_best_without_a_best_checkpoint_is_one_line(tmp_path):
    config = scripted_config(tmp_path, "c.yaml", [0.5], train={"length.steps": 4})
    train_in_process(config)
    run_dir = tmp_path / "run"
    before = checkpoint_names(run_dir)
    for overrides, why in (
        ([], "has no best/ and train.eval.best_metric is not set"),
        (
            ["train.eval.best_metric=eval/score", "train.eval.best_mode=min"],
            "no evaluation has been judged by eval/score in",
        ),
    ):
        refused = cli("train", str(config), "train.resume=best", *overrides)
        lines = refused.err.strip().splitlines()
        assert refused.rc == 1 and len(lines) == 1, refused.err[-3000:]
        assert lines[0].startswith("error: train.resume=best: there is no best checkpoint: ")
        assert why in lines[0] and "train.resume=latest" in lines[0]
        assert checkpoint_names(run_dir) == before and not (run_dir / "checkpoints" / "abandoned").exists()
