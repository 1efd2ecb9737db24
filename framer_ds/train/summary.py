"""The run summary printed at start (and kept in metrics.jsonl and the W&B config): what this launch
really trains, as the numbers a user checks before walking away from a job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framer_ds.config.cadence import Cadence
from framer_ds.config.schema import TrainConfig
from framer_ds.engine.accelerator import describe_strategy
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.train.run import TrainingRun
from framer_ds.train.schedule import StepPlan


def run_summary(run: TrainingRun, state: TrainerState, resumed_from: Path | None) -> dict[str, Any]:
    plan, train = run.plan, run.config.train
    summary: dict[str, Any] = {
        "task": run.task.name,
        "train examples": run.train_examples,
        "eval examples": run.eval_examples,
        **run.task.data_summary(),
        "epochs": round(plan.total_steps / plan.updates_per_epoch, 2),
        "optimizer steps per epoch": plan.updates_per_epoch,
        "total optimizer steps": plan.total_steps,
        "micro-batch per process": train.micro_batch_size,
        "gradient accumulation": train.gradient_accumulation_steps,
        "processes": run.accelerator.num_processes,
        "global batch": plan.global_batch,
        "mixed precision": train.mixed_precision,
        "torch.compile": run.compiled or "off (train.compile: false)",
        "frozen base": run.quantized or "full precision (model.base_precision: full)",
        **({"frozen helpers": helpers} if (helpers := run.task.frozen_helpers_placement()) else {}),
        "strategy": describe_strategy(run.accelerator),
        "trainable parameters": run.trainable_parameters,
        "total parameters": run.total_parameters,
        **({"DeepSpeed buffers": run.zero_buffers.describe()} if run.zero_buffers is not None else {}),
        "warmup steps": plan.warmup_steps,
        "evaluate": _cadence(train.eval.every, plan, "at the end")
        if run.eval_loader is not None
        else "never (no eval set)",
        "checkpoint": _cadence(train.checkpoint.every, plan, "only on a stop signal"),
        "keep best": _best_tracking(train, state),
        "start": f"step {state.global_step} from {resumed_from}"
        if resumed_from is not None
        else "step 0 (new run)",
    }
    return summary


def _cadence(cadence: Cadence | None, plan: StepPlan, otherwise: str) -> str:
    return otherwise if cadence is None else cadence.describe(plan.updates_per_epoch, plan.total_steps)


def _best_tracking(train: TrainConfig, state: TrainerState) -> str:
    best = train.eval
    if best.best_metric is None:
        return "off (train.eval.best_metric not set)"
    tracked = f"best/ at the {'highest' if best.best_mode == 'max' else 'lowest'} {best.best_metric}"
    judged_alike = (state.best_metric, state.best_mode) == (best.best_metric, best.best_mode)
    if judged_alike and state.best_value is not None:
        return f"{tracked} (so far {state.best_value:.6g} at step {state.best_step})"
    return tracked


def format_summary(summary: dict[str, Any]) -> str:
    """The printed form; nested tables (e.g. length statistics) stay in metrics.jsonl and W&B only."""
    shown = {key: value for key, value in summary.items() if not isinstance(value, dict)}
    width = max(map(len, shown))
    rows = [
        f"  {key:<{width}} : {f'{value:,}' if isinstance(value, int) else value}"
        for key, value in shown.items()
    ]
    return "\n".join(["***** Running training *****", *rows])
