"""Optimizer steps the engine skipped on an fp16 overflow: counted, logged, and a stop when they never end.

Why: under fp16 the engine's loss scaler (DeepSpeed's, torch's GradScaler) skips the update of a step
whose gradients overflowed and lowers the scale; the loop used to count that step as trained, log its
loss and advance the step counter and the LR schedule. Now such a window is like a skipped non-finite
window (`faults.NonFiniteTracker`): no optimizer step is counted (global_step, checkpoints and
`train.length.steps` count updates that happened), its loss is not logged, the LR schedule does not move
(what DeepSpeed's engine and accelerate's AcceleratedScheduler do with a scheduler they step), and the run
trains on with the next window. What is logged instead: `train/skipped_steps` (the run's running count,
kept in every checkpoint) and `train/loss_scale` (the scale after the engine's back-off), on the line of
the step number the skipped step would have had (a resume from the checkpoint before it drops the line
with the rest of that timeline), and on every training line of a run that scales its loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from framer_ds.engine.accelerator import uses_deepspeed
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.loss_scale import current_loss_scale
from framer_ds.engine.metrics import MetricsLogger
from framer_ds.train.console import say
from framer_ds.train.faults import NonFiniteLossError, divergence_advice
from framer_ds.train.run import TrainingRun

SKIPPED_KEY = "train/skipped_steps"
LOSS_SCALE_KEY = "train/loss_scale"


class LossScaleOverflowError(NonFiniteLossError):
    """Too many optimizer steps in a row were skipped on an overflow: the gradients stay inf/NaN."""


def loss_scale_metrics(run: TrainingRun, state: TrainerState) -> dict[str, float]:
    """The training line's `train/loss_scale` and `train/skipped_steps` in a run that scales its loss
    (fp16); nothing in one that does not, unless an engine skipped a step there too."""
    scale = current_loss_scale(run.accelerator, run.model, run.optimizer)
    if scale is None and not state.skipped_steps:
        return {}
    return {SKIPPED_KEY: float(state.skipped_steps), **({LOSS_SCALE_KEY: scale} if scale is not None else {})}


@dataclass
class OverflowTracker:
    """Counts the windows whose optimizer step the engine skipped; stops after `max_consecutive` in a row
    (`train.nonfinite.max_consecutive`, the limit a run of non-finite losses has)."""

    max_consecutive: int
    output_dir: Path  # where the advice finds the checkpoint to resume from
    learning_rate: float  # the advice suggests a tenth of it
    consecutive: int = 0

    def record(self, run: TrainingRun, state: TrainerState, logger: MetricsLogger, skipped: bool) -> bool:
        """After each window that was not poisoned: True when its step was skipped (the caller counts no
        step); then `state.skipped_steps` has grown, the console and metrics.jsonl have said so, and the
        `max_consecutive`-th skip in a row has raised LossScaleOverflowError. Every rank alike."""
        if not skipped:
            self.consecutive = 0
            return False
        self.consecutive += 1
        state.skipped_steps += 1
        attempted = state.global_step + 1
        metrics = loss_scale_metrics(run, state)
        scale = metrics.get(LOSS_SCALE_KEY)
        scale_note = f"; loss scale now {scale:g}" if scale is not None else ""
        say(
            run.accelerator,
            f"gradient overflow: optimizer step {attempted} skipped by the engine{scale_note}",
        )
        logger.log(metrics, attempted)
        if self.consecutive >= self.max_consecutive:
            raise LossScaleOverflowError(self._stop_message(run, state.global_step, scale))
        return True

    def _stop_message(self, run: TrainingRun, step: int, scale: float | None) -> str:
        at_scale = f", loss scale now {scale:g}" if scale is not None else ""
        deepspeed = uses_deepspeed(run.accelerator)
        start = "lower fp16.initial_scale_power in the DeepSpeed JSON or " if deepspeed else ""
        return (
            f"gradient overflow: the engine skipped {self.consecutive} optimizer steps in a row after step "
            f"{step}{at_scale} (train.nonfinite.max_consecutive={self.max_consecutive}): the gradients stay "
            "inf/NaN. Train in bf16 (train.mixed_precision=bf16) or with a lower learning rate; if the scale "
            f"was still coming down from its start, {start}raise train.nonfinite.max_consecutive. "
            + divergence_advice(self.output_dir, self.learning_rate)
        )
