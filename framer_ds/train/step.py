"""One optimizer step: the micro-batches of an accumulation window -> backward -> clip -> step.

Why the window is known before its first backward: a task that reports a summed loss (tokens,
pixels) is normalised by the items of the WHOLE window on ALL ranks, so accumulating unequal
micro-batches gives the gradient of one big batch. accelerate and DeepSpeed divide every backward by
the accumulation steps and average gradients over the ranks; scaling each summed loss by
accumulation x ranks / window items undoes both and leaves sum(loss) / items.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from framer_ds.engine.accelerator import accumulation_step, uses_deepspeed
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.finite import exchange_flags
from framer_ds.engine.loss_scale import scale_before_step, step_was_skipped
from framer_ds.engine.precision import to_compute_dtype
from framer_ds.tasks.base import TrainingLoss
from framer_ds.train.faults import NonFiniteLossError
from framer_ds.train.run import TrainingRun


@dataclass
class Window:
    """The micro-batches of one optimizer step, read lazily; `size` of them (the last one steps)."""

    size: int
    batches: Iterator[Any]


@dataclass
class StepOutcome:
    """What one accumulation window produced on this rank (loss figures stay on the device)."""

    loss_total: torch.Tensor  # sum of the reported losses: batch means, or summed losses
    loss_items: torch.Tensor  # what they cover: micro-batches (means) or counted items (sums)
    micro_batches: int
    items_all_ranks: float | None  # counted items over the window and every rank (summing tasks)
    poisoned: bool  # a non-finite loss on some rank: the step was skipped
    stop_requested: bool  # a stop signal reached some rank
    grad_norm: torch.Tensor | float | None  # read (a device sync) only when a log line needs it
    part_totals: torch.Tensor | None = None  # (summed loss, items) per task loss part, flattened
    # The engine's loss scaler found an inf/NaN gradient and did not update the weights (fp16 overflow:
    # engine/loss_scale.py); the loop then counts no step. Every rank gets the same answer.
    skipped: bool = False


def windows(run: TrainingRun, state: TrainerState) -> Iterator[Window]:
    """The micro-batches of each optimizer step, from `state`'s position to the end of training.

    A window ends at a multiple of `gradient_accumulation_steps` or at the end of the epoch (the last
    window of an epoch may be short), the same boundaries accelerate's `accumulate()` draws. `state`'s
    epoch and position advance as the batches are consumed. Endless: the caller stops asking once the
    step plan's total is reached.
    """
    plan, accumulation = run.plan, run.config.train.gradient_accumulation_steps
    while True:
        set_loader_epoch(run.train_loader, state.epoch)
        loader: Iterable[Any] = run.train_loader
        if state.batches_in_epoch:
            loader = run.accelerator.skip_first_batches(run.train_loader, state.batches_in_epoch)
        batches = iter(loader)
        start_epoch = state.epoch
        while state.epoch == start_epoch:
            position = state.batches_in_epoch
            size = min(accumulation - position % accumulation, plan.batches_per_epoch - position)
            yield Window(size, _advancing(itertools.islice(batches, size), state, plan.batches_per_epoch))
        # Let the epoch's iterator finish: accelerate's loader unregisters itself from the gradient
        # state only at its end, and a batch beyond the plan means the dataset grew under us.
        if next(batches, None) is not None:
            raise RuntimeError(
                f"the training loader yielded more than the {plan.batches_per_epoch} "
                "micro-batches planned per epoch; the dataset's length changed while training"
            )


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """The loader's sampler and its dataset learn the epoch (a dataset may key its augmentation by it,
    framer_ds/data/item_draws.py).

    Why the dataset is told here too: accelerate forwards the epoch to the dataset only when no sampler
    inside its batch sampler has `set_epoch`; under DDP its seedable sampler does, so the dataset
    stayed at epoch 0 and every epoch drew the first epoch's augmentation."""
    loader.set_epoch(epoch)
    dataset_set_epoch = getattr(loader.dataset, "set_epoch", None)
    if dataset_set_epoch is not None:
        dataset_set_epoch(epoch)


def _advancing(batches: Iterator[Any], state: TrainerState, batches_per_epoch: int) -> Iterator[Any]:
    for batch in batches:
        yield batch
        state.batches_in_epoch += 1
        if state.batches_in_epoch == batches_per_epoch:
            state.epoch, state.batches_in_epoch = state.epoch + 1, 0


class OptimizerStep:
    """Runs windows through the model; holds the last finite batch a poisoned DeepSpeed window needs."""

    def __init__(self, run: TrainingRun, stop_requested: Callable[[], bool]):
        self.run = run
        self.stop_requested = stop_requested
        self.summing = run.task.loss_reduction == "sum"
        self._last_finite_batch: Any = None

    def __call__(self, window: Window, step: int) -> StepOutcome:
        run = self.run
        accelerator, model, task = run.accelerator, run.model, run.task
        batches: Iterable[Any] = window.batches
        scale, items_all_ranks = 1.0, None
        if self.summing:
            batches = list(batches)  # the whole window first: its item count normalises every backward
            counts = [float(task.count_loss_items(batch)) for batch in batches]
            items_all_ranks = _sum_over_ranks(accelerator, sum(counts))
            accumulation = run.config.train.gradient_accumulation_steps
            scale = accumulation * accelerator.num_processes / max(items_all_ranks, 1.0)
        device = accelerator.device
        loss_total, loss_items = torch.zeros((), device=device), torch.zeros((), device=device)
        part_totals = torch.zeros(2 * len(task.loss_parts), device=device) if task.loss_parts else None
        poisoned = stop = skipped = False
        grad_norm = None
        micro_batches = 0
        for index, batch in enumerate(batches):
            boundary = index == window.size - 1
            batch = to_compute_dtype(accelerator, batch, task.full_precision_keys)
            with accumulation_step(accelerator, model, boundary):
                loss, parts = split_training_loss(task.training_loss(model, batch))
                bad, stop = loss_flags(accelerator, loss, self.stop_requested)
                poisoned = poisoned or bad
                if not poisoned:
                    self._last_finite_batch = batch
                    loss_total += loss.detach().float()
                    loss_items += counts[index] if self.summing else 1.0
                    if part_totals is not None:
                        part_totals += _flat_parts(task.loss_parts, parts, device)
                    accelerator.backward(loss * scale if self.summing else loss)
                elif boundary and uses_deepspeed(accelerator):
                    self._close_poisoned_deepspeed_window(step)
                if boundary and not poisoned:
                    max_norm = run.config.train.optimizer.max_grad_norm
                    if max_norm > 0:
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
                    scale_before = scale_before_step(accelerator)
                    run.optimizer.step()  # under DeepSpeed the engine stepped in the boundary backward
                    skipped = step_was_skipped(accelerator, run.optimizer, scale_before)
                run.optimizer.zero_grad(set_to_none=True)
            micro_batches += 1
        if micro_batches != window.size:
            raise RuntimeError(
                f"the training loader yielded {micro_batches} of the {window.size} micro-batches planned for "
                f"optimizer step {step + 1}; the dataset's length changed while training"
            )
        return StepOutcome(
            loss_total,
            loss_items,
            micro_batches,
            items_all_ranks,
            poisoned,
            stop,
            grad_norm,
            part_totals,
            skipped,
        )

    def _close_poisoned_deepspeed_window(self, step: int) -> None:
        """DeepSpeed steps inside the boundary `backward`, so a poisoned window cannot simply skip it.

        Close the window with a zero-gradient backward on the last finite batch while every param
        group's LR is 0 (weights unchanged). The LR schedule is the loop's alone (accelerate hands
        DeepSpeed only schedulers of DeepSpeed's own types, never our LambdaLR), so the engine's step
        does not move it, and the loop does not step it for a skipped window: it stays where it is.
        (It used to be moved back one step here, as if the engine had stepped it: every poisoned window
        then set the schedule one step behind the step counter.)
        """
        run = self.run
        if self._last_finite_batch is None:
            raise NonFiniteLossError(
                f"non-finite loss in the first optimizer step ({step + 1}) before any finite batch; "
                "check the data and the model initialisation"
            )
        optimizer = run.optimizer
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        zero_loss = split_training_loss(run.task.training_loss(run.model, self._last_finite_batch))[0] * 0.0
        run.accelerator.backward(zero_loss)
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr


def loss_flags(accelerator, loss: torch.Tensor, stop_requested: Callable[[], bool]) -> tuple[bool, bool]:
    """(some rank's loss is not finite, some rank was asked to stop), agreed by every rank: one device
    sync and, with several ranks, one all-reduce per micro-batch. Its own function because that is what
    the non-finite policy costs; benchmarks/gpu/nonfinite_cost.py measures it by replacing it."""
    return exchange_flags(accelerator, not bool(torch.isfinite(loss.detach()).all()), stop_requested())


def split_training_loss(result: torch.Tensor | TrainingLoss) -> tuple[torch.Tensor, dict]:
    """(loss, parts) from what a task's `training_loss` returned."""
    if isinstance(result, TrainingLoss):
        return result.loss, result.parts
    return result, {}


def _flat_parts(names: tuple[str, ...], parts: dict, device: torch.device) -> torch.Tensor:
    """[sum_0, items_0, sum_1, items_1, ...] in `names` order, detached; a missing part adds nothing."""
    values = []
    for name in names:
        total, items = parts.get(name, (0.0, 0.0))
        values += [
            torch.as_tensor(total, device=device).detach().float(),
            torch.as_tensor(items, device=device).float(),
        ]
    return torch.stack(values)


def _sum_over_ranks(accelerator, value: float) -> float:
    if accelerator.num_processes == 1:
        return value
    total = torch.tensor(value, dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(total, reduction="sum").item())
