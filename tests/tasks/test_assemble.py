"""A task is built in one order, written once (`tasks/assemble.py`): training and `framer-ds eval` both
go through it, so they build the same data the same way. The planner's hooks are no part of the Task
core: a task that declares none gets the defaults from `tasks.planning.planning_hooks`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from conftest import mlp_config, reset_accelerate
from framer_ds.tasks.base import Task
from framer_ds.tasks.planning import PlanningHooks, planning_hooks
from framer_ds.tasks.run_config import load_run_config
from framer_test_tasks import PHASE_CALLS, MlpRegressionTask

PHASES = ["prepare_data", "build_datasets", "setup_frozen", "precompute", "build_model"]
PLANNER_HOOKS = [
    "example_batch",
    "eval_transient",
    "helper_dtypes",
    "eval_only_helpers",
    "frozen_helpers",
    "prepare_model_assets",
    "train_example_count",
    "plan_assumptions",
]


def _config(tmp_path: Path, task: str = "test_mlp_regression", **train):
    path = mlp_config(
        tmp_path / "config.yaml", tmp_path / "run", train=train, model={"width": 16, "depth": 2}
    )
    written = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**written, "task": task}))
    return load_run_config(path)


def test_training_and_eval_build_the_task_in_one_order_from_the_same_seed(tmp_path):
    """Both entry points run the phases in the one order, and seed torch after `prepare_data`: a
    `prepare_data` that draws random numbers (generating built-in data, only when it is missing) left
    `framer-ds eval` building its datasets from another point of the stream than training did (it
    seeded before preparing the data), so a split drawn from the global RNG differed between them."""
    from framer_ds.train.evaluate_export import evaluate_run
    from framer_ds.train.loop import run_training

    train = {"length.steps": 2, "lr_schedule.warmup": None, "eval.every": None}
    config = _config(tmp_path, "test_phase_recording", **train)
    PHASE_CALLS.clear()
    run_training(config)
    trained = list(PHASE_CALLS)
    reset_accelerate()  # a second Accelerator in this process
    PHASE_CALLS.clear()
    evaluate_run(tmp_path / "run")
    evaluated = list(PHASE_CALLS)
    assert [phase for phase, _ in trained] == PHASES
    assert [phase for phase, _ in evaluated] == PHASES
    # from build_datasets on, both draw the same numbers: both seeded right after prepare_data
    assert trained[1:] == evaluated[1:]


def test_the_task_core_holds_no_planner_hook():
    """Only the lab calls them: they live in the optional `PlanningHooks`, not on `Task`."""
    assert [name for name in PLANNER_HOOKS if hasattr(Task, name)] == []
    assert all(callable(getattr(PlanningHooks, name)) for name in PLANNER_HOOKS)


def test_a_task_without_planner_hooks_gets_the_defaults(tmp_path):
    task = MlpRegressionTask(_config(tmp_path))
    hooks = planning_hooks(task)
    batch = hooks.example_batch(3)  # the first items of the training set, collated
    assert batch["x"].shape == (3, task.config.data.dim) and torch.equal(batch["id"], torch.arange(3))
    assert hooks.frozen_helpers() == [] and hooks.eval_only_helpers() == []
    linear = torch.nn.Linear(2, 2)
    assert hooks.helper_dtypes([linear, linear], torch.bfloat16) == [torch.bfloat16] * 2
    assert hooks.train_example_count() is None and hooks.plan_assumptions() == []
    assert hooks.eval_transient(linear, [], batch) is None
    hooks.prepare_model_assets()  # the default is the task's prepare_data


def test_a_task_with_planner_hooks_is_asked_itself(tmp_path):
    class Counted(PlanningHooks, MlpRegressionTask):
        def train_example_count(self) -> int:
            return self.config.data.num_samples

    task = Counted(_config(tmp_path))
    assert planning_hooks(task) is task and planning_hooks(task).train_example_count() == 512
    with pytest.raises(AttributeError):
        planning_hooks(MlpRegressionTask(task.config)).no_such_hook  # noqa: B018
