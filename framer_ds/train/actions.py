"""What happens after an optimizer step, as named actions: log, evaluate, keep the best, write samples,
checkpoint.

What they share (the context, the base class, the throughput clock) is in train/step_context.py.

Why actions: the loop stays a short sequence ("step, then every due action"), and a new behaviour
(keep the best checkpoint after each eval, say) is one more action in `default_actions` instead of
an edit in the middle of the loop. Every action runs on every rank: evaluation, sampling and saving
are collectives under ZeRO-3; only the writing inside them is rank 0's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import Accelerator

from framer_ds.config.cadence import Cadence
from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.best import BEST_DIR, BEST_RECORD
from framer_ds.engine.checkpoint import (
    newest_checkpoint,
    reporting_full_disk_during_save,
    save_checkpoint,
)
from framer_ds.engine.export import publish_export
from framer_ds.engine.finite import Finiteness, agreed_finiteness
from framer_ds.engine.metrics import memory_stats
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.train.console import say
from framer_ds.train.evaluate import evaluate
from framer_ds.train.faults import Preempted
from framer_ds.train.full_disk import reporting_full_disk_in_export, reporting_full_disk_in_samples
from framer_ds.train.overflow import loss_scale_metrics
from framer_ds.train.run import TrainingRun
from framer_ds.train.step_context import StepAction, StepContext, Throughput  # noqa: F401  (re-exported)
from framer_ds.train.stop_window import slow_checkpoint_warning


class LogMetrics(StepAction):
    """A metrics.jsonl line (and tracker log): loss over the steps since the last line, across ranks."""

    name = "log"
    counts_as_training_time = True

    def run(self, ctx: StepContext) -> None:
        accelerator, run = ctx.run.accelerator, ctx.run
        parts = ctx.part_totals if ctx.part_totals is not None else ctx.loss_total.new_zeros(0)
        totals = torch.cat([torch.stack([ctx.loss_total, ctx.loss_items]), parts])
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals, reduction="sum")
        loss_total, loss_items, *part_values = totals.tolist()
        state, plan = ctx.state, run.plan
        summing = run.task.loss_reduction == "sum"
        line = {
            "loss": loss_total / max(loss_items, 1e-12),
            "lr": ctx.step_lr if ctx.step_lr is not None else run.scheduler.get_last_lr()[0],
            "epoch": state.epoch + state.batches_in_epoch / plan.batches_per_epoch,
            "samples": float(state.samples_seen),
            **ctx.throughput.rates(run.task.loss_items_name if summing else None),
            **worst_rank_memory(accelerator),
            **loss_scale_metrics(run, state),  # fp16: train/loss_scale, train/skipped_steps
            **run.task.log_labels(),  # text, e.g. the bucket trained (video_lora data.buckets)
        }
        for index, name in enumerate(run.task.loss_parts):
            part_sum, part_items = part_values[2 * index : 2 * index + 2]
            if part_items > 0:
                line[name] = part_sum / part_items
        if ctx.outcome is not None and ctx.outcome.grad_norm is not None:
            line["grad_norm"] = float(ctx.outcome.grad_norm)
        ctx.logger.log(line, state.global_step)
        postfix = {"loss": f"{line['loss']:.4f}"}
        if summing:
            rate = f"{run.task.loss_items_name}_per_s"
            postfix[rate] = f"{line[rate]:.4g}"
        ctx.progress.set_postfix(postfix, refresh=False)
        ctx.loss_total.zero_()
        ctx.loss_items.zero_()
        if ctx.part_totals is not None:
            ctx.part_totals.zero_()
        ctx.throughput.reset()


def worst_rank_memory(accelerator: Accelerator) -> dict[str, float]:
    """Each memory figure as the largest over the ranks: the rank that runs out first is not always rank
    0 (ZeRO partitions and uneven batches differ), and rank 0 is the one that logs."""
    stats = memory_stats()
    if accelerator.num_processes == 1:
        return stats
    local = torch.tensor(list(stats.values()), dtype=torch.float64, device=accelerator.device)
    worst = accelerator.gather(local).view(accelerator.num_processes, -1).amax(dim=0)
    return dict(zip(stats, worst.tolist(), strict=True))


class Evaluate(StepAction):
    name = "evaluate"
    starts_new_work = True

    def due(self, ctx: StepContext) -> bool:
        # A run without an eval set never evaluates; with one it always does at the end.
        return ctx.run.eval_loader is not None and (ctx.done or super().due(ctx))

    def due_on_resume(self, ctx: StepContext, deferred: set[str]) -> bool:
        return ctx.run.eval_loader is not None and super().due_on_resume(ctx, deferred)

    def run(self, ctx: StepContext) -> None:
        run = ctx.run
        ctx.eval_metrics = evaluate(
            run.accelerator, run.task, run.model, run.eval_loader, run.config.train.eval.max_batches
        )
        ctx.evaluated_at = ctx.state.global_step
        ctx.logger.log(ctx.eval_metrics, ctx.state.global_step)
        say(run.accelerator, _format_metrics(ctx.state.global_step, ctx.eval_metrics))


class KeepBest(StepAction):
    """After an evaluation that beats every earlier one on `train.eval.best_metric` (strictly; the first
    always does), `best/` becomes the task's export of the model as it is now, plus `best.json` (step,
    metric, value, mode), published atomically like `final/`. The best value lives in TrainerState, so
    it is in every checkpoint and a resumed run replaces `best/` only with a better model. best.json is
    also what keeps the checkpoint of that evaluation from keep_last pruning and what `train.resume=best`
    resumes (`engine.checkpoint.best_checkpoint`)."""

    name = "keep-best"
    starts_new_work = True

    def __init__(self, metric: str, mode: str):
        super().__init__(None)
        self.metric, self.mode = metric, mode

    def due(self, ctx: StepContext) -> bool:
        return ctx.evaluated_at == ctx.state.global_step

    def due_on_resume(self, ctx: StepContext, deferred: set[str]) -> bool:
        return self.name in deferred or (Evaluate.name in deferred and self.due(ctx))  # after a put-off eval

    def run(self, ctx: StepContext) -> None:
        state, step = ctx.state, ctx.state.global_step
        if self.metric not in ctx.eval_metrics:
            available = ", ".join(sorted(ctx.eval_metrics)) or "none"
            raise ConfigError(
                [
                    ConfigProblem(
                        "train.eval.best_metric",
                        f"{self.metric!r} is not among the metrics task {ctx.run.task.name!r} evaluates "
                        f"(at step {step}: {available}); set train.eval.best_metric to one of them",
                    )
                ],
                "the run's config",
            )
        value = float(ctx.eval_metrics[self.metric])
        state.forget_best_unless(self.metric, self.mode)
        if state.best_value is not None and not (ctx.output_dir / BEST_DIR / BEST_RECORD).is_file():
            # best/ was set aside with an abandoned timeline (resumed from before it): nothing on disk
            # holds the stored best any more, so this timeline's evaluations start best/ anew.
            state.best_value = state.best_step = None
        if self.improves(value, state.best_value):
            record = {"step": step, "metric": self.metric, "value": value, "mode": self.mode}
            finite = write_export(ctx.run, ctx.output_dir / BEST_DIR, record=(BEST_RECORD, record))
            if finite.ok:
                state.best_value, state.best_step = value, step
                say(
                    ctx.run.accelerator,
                    f"step {step}: best {self.metric}={value:.4f} so far, exported to best/",
                )
            else:
                say(ctx.run.accelerator, f"warning: step {step}: {finite.describe()}; best/ is kept")
        elif not math.isfinite(value):
            say(ctx.run.accelerator, f"step {step}: {self.metric}={value} is not finite; best/ is kept")
        if state.best_value is not None:
            ctx.logger.log({f"best/{self.metric}": state.best_value}, step)

    def improves(self, value: float, best: float | None) -> bool:
        """Strictly better than `best` (any finite value beats none; NaN and inf never count)."""
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        return value > best if self.mode == "max" else value < best


def write_export(run: TrainingRun, target: Path, record: tuple[str, dict] | None = None) -> Finiteness:
    """The task's export (`final/`, `best/`) into `target`, atomically, with an optional JSON record
    (name, content) inside it, published together with the weights. Call on EVERY rank.

    Nothing is written when the trainable weights are not finite on some rank (an export of NaN
    weights replaced a good `best/` or `final/`); the caller learns it from the returned `Finiteness`.
    A full disk deletes the staging directory and raises DiskFullError (train/full_disk.py)."""
    accelerator = run.accelerator
    finite = agreed_finiteness(accelerator, run.model)
    if not finite.ok:
        return finite

    def write(staging: Path) -> None:
        run.task.export_with_record(accelerator, run.model, staging)
        if record is not None and accelerator.is_main_process:
            atomic_write_json(staging / record[0], record[1])

    with reporting_full_disk_in_export(target):
        publish_export(accelerator, target, write)
    return finite


class WriteSamples(StepAction):
    """The task's media (videos, audio, images) from the model being trained, under samples/step_N."""

    name = "samples"
    starts_new_work = True

    def due_on_resume(self, ctx: StepContext, deferred: set[str]) -> bool:
        return self.cadence is not None and super().due_on_resume(ctx, deferred)  # unless turned off since

    def run(self, ctx: StepContext) -> None:
        run, samples = ctx.run, ctx.output_dir / "samples"
        with reporting_full_disk_in_samples(samples, ctx.state.global_step):
            written = run.task.write_samples(run.accelerator, run.model, ctx.state.global_step, samples)
        ctx.logger.log_media("samples", written, ctx.state.global_step)


class SaveCheckpoint(StepAction):
    """A resumable checkpoint on schedule, or at once when a stop signal reached any rank; after the
    signal's checkpoint the run stops with `Preempted` (exit 75, requeue). Asking whether it is due is
    the safe point after every step: the ranks agree on the stop there, before the next step starts.

    Only from a finite state: weights that went NaN/inf in an update whose loss was still finite would
    otherwise be published, counted against keep_last (pruning the good checkpoints) and resumed by
    `train.resume=latest`. Such a save is skipped, on every rank alike, with a warning naming the step."""

    name = "checkpoint"
    warned_slow = False  # a checkpoint took longer than a stop signal leaves (train/stop_window.py)

    def due(self, ctx: StepContext) -> bool:
        return super().due(ctx) or ctx.stop.check()

    def due_on_resume(self, ctx: StepContext, deferred: set[str]) -> bool:
        return ctx.stop.check()  # a stop during the put-off work writes the step's checkpoint again

    def run(self, ctx: StepContext) -> None:
        run, accelerator, step = ctx.run, ctx.run.accelerator, ctx.state.global_step

        def task_artifacts(directory: Path) -> None:
            run.task.checkpoint_artifacts(accelerator, run.model, directory)

        finite = agreed_finiteness(accelerator, run.model, run.optimizer)
        if finite.ok:
            started = time.monotonic()
            with reporting_full_disk_during_save(run.config.output_dir, ctx.state.global_step):
                path = save_checkpoint(accelerator, run.config, ctx.state, extra_artifacts=task_artifacts)
            warning = slow_checkpoint_warning(time.monotonic() - started, step)
            if warning and not self.warned_slow:  # once a run: every checkpoint is about as slow
                self.warned_slow = True
                say(accelerator, warning)
        else:
            path = newest_checkpoint(ctx.output_dir)
            newest = f"the newest finite checkpoint stays {path}" if path else "no finite checkpoint exists"
            say(
                accelerator,
                f"warning: step {step}: {finite.describe()}; checkpoint step_{step} NOT written, {newest}",
            )
        if ctx.stop.check():  # asked before, or during the save: this checkpoint answers it
            raise Preempted(step, ctx.stop.signal_name, path)


def default_actions(run: TrainingRun) -> list[StepAction]:
    """In order: the log line first (it covers the step just taken), the best model right after the
    evaluation it follows, the checkpoint last (it captures what the others did, the best value
    included, and a stop signal ends the run there)."""
    train = run.config.train
    best = train.eval
    keep_best = [KeepBest(best.best_metric, best.best_mode or "max")] if best.best_metric is not None else []
    sample_every = run.task.sample_every()
    return [
        LogMetrics(Cadence(steps=train.log_every)),
        Evaluate(train.eval.every),
        *keep_best,
        WriteSamples(Cadence(steps=sample_every) if sample_every else None),
        SaveCheckpoint(train.checkpoint.every),
    ]


def run_due_actions(
    actions: list[StepAction], ctx: StepContext, due: Callable[[StepAction], bool] | None = None
) -> None:
    """Each action that is `due` (on every rank, in order), except that once the ranks agree on a stop,
    one that starts new work is put off: named in the trainer state, which the stop checkpoint (the
    last action) stores, for the resumed run to do first (`train/deferred.py`)."""
    for action in actions:
        if not (action.due(ctx) if due is None else due(action)):
            continue
        if action.starts_new_work and ctx.stop.check():
            defer(action, ctx)
            continue
        if action.counts_as_training_time:
            action.run(ctx)
        else:
            with ctx.throughput.paused():
                action.run(ctx)


def answer_stop_after_a_skipped_window(actions: list[StepAction], ctx: StepContext) -> None:
    """After a window whose step was skipped (a non-finite loss, an fp16 overflow): no action is due,
    but it is still a safe point. A stop the ranks agree on is answered here by the checkpoint of the
    last trained step (the data position and random state past the skipped window), not after yet
    another window. Every rank alike (all skip the same windows)."""
    if ctx.stop.check():
        run_due_actions([a for a in actions if isinstance(a, SaveCheckpoint)], ctx, due=lambda _: True)


def defer(action: StepAction, ctx: StepContext) -> None:
    """Put `action` off to the resumed run, with this step's evaluation when there was one (a put-off
    `keep-best` judges it)."""
    state = ctx.state
    state.deferred_actions = [*state.deferred_actions, action.name]
    if ctx.evaluated_at == state.global_step:
        state.deferred_eval = dict(ctx.eval_metrics)


def _format_metrics(step: int, metrics: dict[str, float]) -> str:
    return f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
