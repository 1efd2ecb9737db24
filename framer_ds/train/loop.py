"""The ONE training loop: windows of micro-batches -> optimizer steps -> the step actions that are due.

It never knows which task it runs: the task supplies model, data, loss, eval values and export; what
happens after a step (log, evaluate, keep the best, samples, checkpoint) is a list of actions
(`train/actions.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from framer_ds.config.errors import ConfigError
from framer_ds.config.launch_check import check_runtime_environment
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.accelerator import build_accelerator, end_accelerator, uses_deepspeed
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.fsdp2 import uses_fsdp2
from framer_ds.engine.metrics import MetricsLogger
from framer_ds.engine.resume import ResumePlan
from framer_ds.engine.run_dir import RunDirectory
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import get_task_class
from framer_ds.train.actions import (
    StepContext,
    Throughput,
    answer_stop_after_a_skipped_window,
    default_actions,
    run_due_actions,
    write_export,
)
from framer_ds.train.console import above_the_progress_bar, say
from framer_ds.train.deferred import run_deferred_actions
from framer_ds.train.faults import (
    NonFiniteTracker,
    NonFiniteWeightsError,
    Preempted,
    StopRequest,
    divergence_advice,
)
from framer_ds.train.overflow import OverflowTracker
from framer_ds.train.preemption import clear_preempted_marker, write_preempted_marker
from framer_ds.train.run import TrainingRun, build_training_run
from framer_ds.train.safe_point import AgreedStop
from framer_ds.train.step import OptimizerStep, windows
from framer_ds.train.stop_window import checkpoint_bytes_per_node, stop_checkpoint_forecast
from framer_ds.train.summary import format_summary, run_summary


@dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    skipped_steps: int = 0  # optimizer steps the engine skipped on an overflow (fp16), resumed runs' too


def run_training(config: RunConfigBase) -> TrainResult:
    """Train `config.task` as configured; raises ConfigError on bad config before any heavy work.

    A stop signal is handled from the first line on: during start-up it stops the run at once, later
    after a checkpoint; either way rank 0 writes preempted.json and `Preempted` reaches the CLI (exit 75).
    """
    stop = StopRequest()
    stop.install()
    try:
        return _start(config, stop)
    except Preempted as preempted:
        if int(os.environ.get("RANK", "0")) == 0:
            write_preempted_marker(
                Path(config.output_dir),
                preempted.signal_name,
                step=preempted.step,
                checkpoint=preempted.checkpoint,
                during_startup=preempted.during_startup,
            )
        raise
    finally:
        stop.uninstall()


def _start(config: RunConfigBase, stop: StopRequest) -> TrainResult:
    """Whatever happens after the Accelerator exists (success, a config error found late, a crash, a
    preemption), its trackers are finished and its process group destroyed exactly once."""
    task = get_task_class(config.task)(config)
    problems = task.check() + check_runtime_environment(config.train, config.model.base_precision)
    if problems:
        raise ConfigError(problems, "pre-flight checks")
    run_dir = RunDirectory.check(config)
    accelerator = build_accelerator(config, collective_timeout_s=config.train.collective_timeout_s)
    failed = True
    try:
        with run_dir.claimed(accelerator):
            result = _run(accelerator, task, run_dir, stop)
        failed = False
        return result
    finally:
        end_accelerator(accelerator, failed=failed)


def _run(accelerator: Accelerator, task: Task, run_dir: RunDirectory, stop: StopRequest) -> TrainResult:
    config = run_dir.config
    plan = ResumePlan.decide(accelerator, config, on_chosen=stop.starting_from)  # before prepare
    run_dir.prepare(accelerator, plan.step)

    run = build_training_run(accelerator, task, config)  # the task's phases: tasks/assemble.py
    state = plan.restore(accelerator, run.optimizer, run.scheduler, config.train, run.plan.batches_per_epoch)
    run_dir.started(accelerator)  # config.yaml: a config error found earlier leaves no run
    if accelerator.is_main_process:
        clear_preempted_marker(config.output_dir)  # this run is no longer the preempted one
    summary = run_summary(run, state, plan.checkpoint)
    say(accelerator, format_summary(summary))
    for warning in run.zero_buffers.warnings if run.zero_buffers is not None else ():
        say(accelerator, f"warning: {warning}")
    if accelerator.is_main_process and (forecast := _stop_checkpoint_forecast(run, plan.checkpoint)):
        say(accelerator, forecast)
    logger = MetricsLogger(accelerator, config, summary, state.global_step)
    try:
        eval_metrics = _train(run, state, logger, stop)
        finite = write_export(run, Path(config.output_dir) / "final")
        if not finite.ok:
            raise NonFiniteWeightsError(
                f"after the last optimizer step ({state.global_step}) {finite.describe()}; final/ was "
                "not exported from them. "
                + divergence_advice(Path(config.output_dir), config.train.optimizer.learning_rate)
            )
    finally:
        logger.close()
    return TrainResult(Path(config.output_dir), state.global_step, eval_metrics, state.skipped_steps)


def _stop_checkpoint_forecast(run: TrainingRun, resumed_from: Path | None) -> str | None:
    """Whether a stop checkpoint fits the stop window, sized before the first one (train/stop_window.py)."""
    accelerator = run.accelerator
    deepspeed = uses_deepspeed(accelerator)
    sharded = deepspeed or uses_fsdp2(accelerator)
    size = checkpoint_bytes_per_node(run.model, accelerator.num_processes, sharded, deepspeed, resumed_from)
    return stop_checkpoint_forecast(size)


def _train(
    run: TrainingRun, state: TrainerState, logger: MetricsLogger, stop: StopRequest
) -> dict[str, float]:
    """Optimizer steps until the plan's total, each followed by the actions that are due."""
    accelerator, plan, train_cfg = run.accelerator, run.plan, run.config.train
    stop.training_started()  # from here a stop signal is remembered and answered with a checkpoint
    progress = tqdm(
        total=plan.total_steps,
        initial=state.global_step,
        desc="train",
        disable=not accelerator.is_main_process,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    device = accelerator.device
    ctx = StepContext(
        run=run,
        state=state,
        logger=logger,
        progress=progress,
        throughput=Throughput(),
        stop=AgreedStop(accelerator, lambda: stop.requested, lambda: stop.signal_name),
        loss_total=torch.zeros((), device=device),
        loss_items=torch.zeros((), device=device),
        epoch_now=state.epoch + state.batches_in_epoch / plan.batches_per_epoch,
    )
    actions = default_actions(run)
    nonfinite = NonFiniteTracker(
        train_cfg.nonfinite.policy,
        train_cfg.nonfinite.max_consecutive,
        Path(run.config.output_dir),
        train_cfg.optimizer.learning_rate,
    )
    overflow = OverflowTracker(
        train_cfg.nonfinite.max_consecutive, Path(run.config.output_dir), train_cfg.optimizer.learning_rate
    )
    step = OptimizerStep(run, lambda: stop.requested)
    run.model.train()
    with above_the_progress_bar():
        try:
            run_deferred_actions(actions, ctx)  # what a stop put off at the step this run resumes from
            for window in windows(run, state):
                if state.global_step >= plan.total_steps:
                    break
                outcome = step(window, state.global_step)
                ctx.stop.learn(outcome.stop_requested)
                nonfinite.record_window(outcome.poisoned, state.global_step)
                if outcome.poisoned:
                    say(accelerator, f"non-finite loss: optimizer step {state.global_step + 1} skipped")
                    logger.log({"nonfinite_skipped_steps": float(nonfinite.skipped_total)}, state.global_step)
                # An overflow skip: the engine updated nothing, so no step, no loss, the LR schedule stays.
                if outcome.poisoned or overflow.record(run, state, logger, outcome.skipped):
                    answer_stop_after_a_skipped_window(actions, ctx)
                    continue
                ctx.step_lr = run.scheduler.get_last_lr()[0]  # what this step ran at, before it moves on
                run.scheduler.step()
                ctx.epoch_before = ctx.epoch_now
                ctx.epoch_now = state.epoch + state.batches_in_epoch / plan.batches_per_epoch
                state.global_step += 1
                samples = plan.global_batch // train_cfg.gradient_accumulation_steps * outcome.micro_batches
                state.samples_seen += samples
                ctx.throughput.record(samples, outcome.items_all_ranks)
                ctx.loss_total += outcome.loss_total
                ctx.loss_items += outcome.loss_items
                if outcome.part_totals is not None:
                    ctx.part_totals = (
                        outcome.part_totals
                        if ctx.part_totals is None
                        else ctx.part_totals + outcome.part_totals
                    )
                ctx.outcome, ctx.done = outcome, state.global_step >= plan.total_steps
                run_due_actions(actions, ctx)
                # After the actions: the bar's print for this step carries the loss logged at it (the log
                # action sets the postfix), which is what `framer-ds report` reads from a job log.
                progress.update(1)
                if ctx.done:
                    break
        finally:
            progress.close()
    return ctx.eval_metrics
