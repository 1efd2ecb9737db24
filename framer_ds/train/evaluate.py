"""Evaluation shared by every task: per-sample values summed over the eval set and all ranks."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from framer_ds.engine.precision import to_compute_dtype
from framer_ds.tasks.base import Task


def evaluate(
    accelerator: Accelerator,
    task: Task,
    model: torch.nn.Module,
    eval_loader: DataLoader,
    max_batches: int | None = None,
) -> dict[str, float]:
    """An evaluation while training, on EVERY rank (under ZeRO-3 each forward is a collective): the
    summed per-sample values and the task's generation metrics, as `eval/*` metrics."""
    sums, num_samples = evaluate_totals(accelerator, task, model, eval_loader, max_batches)
    metrics = task.summarize_eval(sums, num_samples) if sums else {}
    return {**metrics, **task.generation_metrics(accelerator, model, in_training=True)}


@torch.no_grad()
def evaluate_totals(
    accelerator: Accelerator,
    task: Task,
    model: torch.nn.Module,
    eval_loader: DataLoader,
    max_batches: int | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """(each `eval_step` value summed over the eval set and every rank, the number of samples). Every
    rank runs it and gets the same totals.

    Each batch's per-sample values are gathered with `gather_for_metrics`, which drops the samples the
    distributed sampler duplicated to even out the last batch, then summed over the samples into
    float64 totals: the metric covers the eval set exactly once whatever the world size, memory stays
    constant however large the set, and totals such as per-class intersections and unions, or summed
    losses and token counts, give exact ratios in `summarize_eval`.
    """
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    num_samples = 0
    for index, batch in enumerate(eval_loader):
        if max_batches is not None and index >= max_batches:
            break
        batch = to_compute_dtype(accelerator, batch, task.full_precision_keys)
        values = task.eval_step(model, batch)
        gathered = accelerator.gather_for_metrics({k: v.detach() for k, v in values.items()})
        for name, value in gathered.items():
            total = value.double().sum(dim=0).cpu()
            sums[name] = sums[name] + total if name in sums else total
        num_samples += len(next(iter(gathered.values()))) if gathered else 0
    model.train(was_training)
    return sums, num_samples
