"""The run summary printed at start (and kept in metrics.jsonl and the W&B config): what this launch
really trains, as the numbers a user checks before walking away from a job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framer_ds.engine.accelerator import describe_strategy
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.train.run import TrainingRun


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
        "strategy": describe_strategy(run.accelerator),
        "trainable parameters": run.trainable_parameters,
        "total parameters": run.total_parameters,
        "warmup steps": plan.warmup_steps,
        "evaluate": _cadence(plan.eval_every, plan.updates_per_epoch, "at the end")
        if run.eval_loader is not None
        else "never (no eval set)",
        "checkpoint": _cadence(
            plan.checkpoint_every, plan.updates_per_epoch, "only when stopped by a signal"
        ),
        "start": f"step {state.global_step} from {resumed_from}"
        if resumed_from is not None
        else "step 0 (new run)",
    }
    return summary


def _cadence(steps: int | None, per_epoch: int, otherwise: str) -> str:
    if not steps:
        return otherwise
    return f"every {steps} steps ({steps / per_epoch:.3g} epochs)"


def format_summary(summary: dict[str, Any]) -> str:
    width = max(map(len, summary))
    rows = [
        f"  {key:<{width}} : {f'{value:,}' if isinstance(value, int) else value}"
        for key, value in summary.items()
    ]
    return "\n".join(["***** Running training *****", *rows])
