"""What every step action shares: `StepContext` (the run, where it stands, what has been measured),
`StepAction` (when an action is due, on a schedule or on resume) and `Throughput` (the training-time
clock the actions pause). The actions themselves are in train/actions.py; train/deferred.py runs the
ones a stop put off."""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from framer_ds.config.cadence import Cadence
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.metrics import MetricsLogger
from framer_ds.train.run import TrainingRun
from framer_ds.train.safe_point import AgreedStop
from framer_ds.train.step import StepOutcome


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
    stop: AgreedStop  # a stop signal, agreed by every rank at the safe points (train/safe_point.py)
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
    cadence and after the last step; None, never on a schedule (an action may decide `due` itself).

    An action that `starts_new_work` (an evaluation, a `best/` export, samples) does not start once a
    stop signal is agreed: it is put off to the resumed run (`due_on_resume`), and the stop checkpoint
    comes first (train/safe_point.py)."""

    name: str
    counts_as_training_time = False  # most actions pause the throughput clock
    starts_new_work = False

    def __init__(self, cadence: Cadence | None):
        self.cadence = cadence

    def due(self, ctx: StepContext) -> bool:
        if self.cadence is None:
            return False
        plan = ctx.run.plan
        return ctx.done or self.cadence.fires(
            ctx.state.global_step, ctx.epoch_before, ctx.epoch_now, plan.updates_per_epoch, plan.total_steps
        )

    def due_on_resume(self, ctx: StepContext, deferred: set[str]) -> bool:
        """Whether to run when a run resumes from a stop checkpoint that put off the actions `deferred`
        (names) at its step: the ones put off, in their order, and nothing else."""
        return self.name in deferred

    @abstractmethod
    def run(self, ctx: StepContext) -> None: ...
