"""What happens after an optimizer step, as named actions: log, evaluate, keep the best, write samples,
checkpoint.

Why actions: the loop stays a short sequence ("step, then every due action"), and a new behaviour
(keep the best checkpoint after each eval, say) is one more action in `default_actions` instead of
an edit in the middle of the loop. Every action runs on every rank: evaluation, sampling and saving
are collectives under ZeRO-3; only the writing inside them is rank 0's.
"""

from __future__ import annotations

import contextlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from framer_ds.config.cadence import Cadence
from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.checkpoint import (
    TrainerState,
    newest_checkpoint,
    reporting_full_disk_during_save,
    save_checkpoint,
)
from framer_ds.engine.export import publish_export
from framer_ds.engine.finite import Finiteness, agreed_finiteness
from framer_ds.engine.metrics import MetricsLogger, memory_stats
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.train.console import say
from framer_ds.train.evaluate import evaluate
from framer_ds.train.faults import Preempted
from framer_ds.train.run import TrainingRun
from framer_ds.train.step import StepOutcome
from framer_ds.train.stop_window import slow_checkpoint_warning


class Throughput:
    """Samples (and counted items) per second of training time since the last log line.

    Time spent in actions (eval, sampling, checkpoints) is excluded: `paused()` stops the clock. The
    old loop restarted its clock after an eval but still divided by every step since the last log
    line, which overstated samples_per_s whenever an action ran between two log lines.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.samples = 0
        self.items = 0.0
        self.seconds = 0.0
        self._since = time.perf_counter()

    def record(self, samples: int, items: float | None) -> None:
        self.samples += samples
        self.items += items or 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.seconds += time.perf_counter() - self._since
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def rates(self, items_name: str | None) -> dict[str, float]:
        elapsed = max(self.seconds + time.perf_counter() - self._since, 1e-9)
        rates = {"samples_per_s": self.samples / elapsed}
        if items_name is not None:
            rates[f"{items_name}_per_s"] = self.items / elapsed
        return rates


@dataclass
class StepContext:
    """What the actions of one run share: the run, where it stands, and what has been measured."""

    run: TrainingRun
    state: TrainerState
    logger: MetricsLogger
    progress: tqdm
    throughput: Throughput
    signal_name: Callable[[], str | None]
    loss_total: torch.Tensor  # since the last log line, this rank
    loss_items: torch.Tensor
    part_totals: torch.Tensor | None = None  # the task's loss parts since the last log line, this rank
    outcome: StepOutcome | None = None  # the step just taken
    step_lr: float | None = None  # the learning rate that step ran at (the schedule has moved on since)
    done: bool = False  # the last step of the run
    epoch_before: float = 0.0  # position in epochs before and after the step just taken
    epoch_now: float = 0.0
    eval_metrics: dict[str, float] = field(default_factory=dict)  # the latest evaluation
    evaluated_at: int | None = None  # the step of that evaluation

    @property
    def output_dir(self) -> Path:
        return Path(self.run.config.output_dir)


class StepAction(ABC):
    """Runs after an optimizer step when `due`; `run` happens on every rank.

    `cadence` (framer_ds.config.cadence: steps, epochs or a fraction of the run) makes it due on that
    cadence and after the last step; None, never on a schedule (an action may decide `due` itself)."""

    name: str
    counts_as_training_time = False  # most actions pause the throughput clock

    def __init__(self, cadence: Cadence | None):
        self.cadence = cadence

    def due(self, ctx: StepContext) -> bool:
        if self.cadence is None:
            return False
        plan = ctx.run.plan
        return ctx.done or self.cadence.fires(
            ctx.state.global_step, ctx.epoch_before, ctx.epoch_now, plan.updates_per_epoch, plan.total_steps
        )

    @abstractmethod
    def run(self, ctx: StepContext) -> None: ...


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

    def due(self, ctx: StepContext) -> bool:
        # A run without an eval set never evaluates; with one it always does at the end.
        return ctx.run.eval_loader is not None and (ctx.done or super().due(ctx))

    def run(self, ctx: StepContext) -> None:
        run = ctx.run
        ctx.eval_metrics = evaluate(
            run.accelerator, run.task, run.model, run.eval_loader, run.config.train.eval.max_batches
        )
        ctx.evaluated_at = ctx.state.global_step
        ctx.logger.log(ctx.eval_metrics, ctx.state.global_step)
        say(run.accelerator, _format_metrics(ctx.state.global_step, ctx.eval_metrics))


BEST_DIR = "best"
BEST_RECORD = "best.json"


class KeepBest(StepAction):
    """After an evaluation that beats every earlier one on `train.eval.best_metric` (strictly; the first
    always does), `best/` becomes the task's export of the model as it is now, plus `best.json` (step,
    metric, value, mode), published atomically like `final/`. The best value lives in TrainerState, so
    it is in every checkpoint and a resumed run replaces `best/` only with a better model."""

    name = "keep-best"

    def __init__(self, metric: str, mode: str):
        super().__init__(None)
        self.metric, self.mode = metric, mode

    def due(self, ctx: StepContext) -> bool:
        return ctx.evaluated_at == ctx.state.global_step

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
    weights replaced a good `best/` or `final/`); the caller learns it from the returned `Finiteness`."""
    accelerator = run.accelerator
    finite = agreed_finiteness(accelerator, run.model)
    if not finite.ok:
        return finite

    def write(staging: Path) -> None:
        run.task.export_with_record(accelerator, run.model, staging)
        if record is not None and accelerator.is_main_process:
            atomic_write_json(staging / record[0], record[1])

    publish_export(accelerator, target, write)
    return finite


class WriteSamples(StepAction):
    """The task's media (videos, audio, images) from the model being trained, under samples/step_N."""

    name = "samples"

    def run(self, ctx: StepContext) -> None:
        run = ctx.run
        written = run.task.write_samples(
            run.accelerator, run.model, ctx.state.global_step, ctx.output_dir / "samples"
        )
        ctx.logger.log_media("samples", written, ctx.state.global_step)


class SaveCheckpoint(StepAction):
    """A resumable checkpoint on schedule, or at once when a stop signal reached any rank; after the
    signal's checkpoint the run stops with `Preempted` (exit 75, requeue).

    Only from a finite state: weights that went NaN/inf in an update whose loss was still finite would
    otherwise be published, counted against keep_last (pruning the good checkpoints) and resumed by
    `train.resume=latest`. Such a save is skipped, on every rank alike, with a warning naming the step."""

    name = "checkpoint"
    warned_slow = False  # a checkpoint took longer than a stop signal leaves (train/stop_window.py)

    def due(self, ctx: StepContext) -> bool:
        return super().due(ctx) or (ctx.outcome is not None and ctx.outcome.stop_requested)

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
        if ctx.outcome is not None and ctx.outcome.stop_requested:
            raise Preempted(step, ctx.signal_name() or "a stop signal on another rank", path)


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


def run_due_actions(actions: list[StepAction], ctx: StepContext) -> None:
    for action in actions:
        if not action.due(ctx):
            continue
        if action.counts_as_training_time:
            action.run(ctx)
        else:
            with ctx.throughput.paused():
                action.run(ctx)


def _format_metrics(step: int, metrics: dict[str, float]) -> str:
    return f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
