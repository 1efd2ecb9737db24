"""`ResumePlan` itself: a fresh run's plan, a plan decided from a checkpoint, and restore applying the
running config's learning rate. One process, the test MLP task; the rules behind it have their own files
(test_resume_choice via the fault cases, test_best_checkpoint's config diff, test_resume_strategy,
test_resume_world_size)."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.utils import set_seed

from conftest import mlp_config, train_in_process
from framer_ds.engine.accelerator import build_accelerator
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.resume import ResumePlan
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.run import build_training_run

TOTAL_STEPS, WARMUP, CHECKPOINT_STEP = 6, 2, 4
TINY = {
    "model": {"width": 32, "depth": 2},
    "data": {"num_samples": 128, "eval_samples": 16, "dim": 8},
    "train": {
        "length.steps": TOTAL_STEPS,
        "lr_schedule.warmup.steps": WARMUP,
        "gradient_accumulation_steps": 1,
        "lr_schedule.name": "linear",
        "checkpoint.every.steps": CHECKPOINT_STEP,
        "eval.every": None,
    },
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The YAML of a 6-step run that wrote checkpoints/step_4 and step_6 (its learning rate 1e-3)."""
    root = tmp_path_factory.mktemp("resume_plan")
    path = mlp_config(root / "mlp.yaml", root / "run", **TINY)
    train_in_process(path)
    return path


def test_a_fresh_run_plans_nothing_and_restores_the_start(tmp_path):
    config = load_run_config(mlp_config(tmp_path / "mlp.yaml", tmp_path / "run", **TINY))
    accelerator = build_accelerator(config)
    plan = ResumePlan.decide(accelerator, config)
    assert (plan.checkpoint, plan.load_from, plan.step, plan.changes) == (None, None, None, ())
    assert plan.restore(accelerator, None, None, config.train, batches_per_epoch=16) == TrainerState()


def test_a_plan_from_a_checkpoint_restores_it_at_the_running_learning_rate(trained, capsys):
    new_lr = 5e-4
    step_dir = trained.parent / "run" / "checkpoints" / f"step_{CHECKPOINT_STEP}"  # not the final step_6
    config = load_run_config(trained, [f"train.resume={step_dir}", f"train.optimizer.learning_rate={new_lr}"])
    accelerator = build_accelerator(config)
    heard: list[tuple[int, Path]] = []
    plan = ResumePlan.decide(accelerator, config, on_chosen=lambda *chosen: heard.append(chosen))
    assert plan.checkpoint == plan.load_from == step_dir and plan.step == CHECKPOINT_STEP
    assert heard == [(CHECKPOINT_STEP, step_dir)]
    assert plan.changes == ("train.optimizer.learning_rate: 0.001 -> 0.0005",)
    assert "changed on resume: train.optimizer.learning_rate: 0.001 -> 0.0005" in capsys.readouterr().out

    task = get_task_class(config.task)(config)
    task.prepare_data()
    set_seed(config.train.seed)
    run = build_training_run(accelerator, task, config)
    state = plan.restore(accelerator, run.optimizer, run.scheduler, config.train, run.plan.batches_per_epoch)
    assert state.global_step == CHECKPOINT_STEP and state.world_size == 1
    # Linear decay after warmup: lr = base * (total - step) / (total - warmup). The running base (5e-4),
    # not the checkpoint's 1e-3 that load_state restored; same float operations as transformers'
    # lambda (one division, one product), so equal to rounding (rel 1e-12 leaves room for the order).
    expected = new_lr * (TOTAL_STEPS - CHECKPOINT_STEP) / (TOTAL_STEPS - WARMUP)
    lrs = [group["lr"] for group in run.optimizer.param_groups]
    assert lrs == pytest.approx([expected] * len(lrs), rel=1e-12)
    assert run.scheduler.get_last_lr() == pytest.approx([expected] * len(lrs), rel=1e-12)
    assert f"resumed from {step_dir} at step {CHECKPOINT_STEP}" in capsys.readouterr().out
