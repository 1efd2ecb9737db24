"""Evaluation shared by every task: per-sample values gathered across ranks, then summarised."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from framer_ds.tasks.base import Task
from framer_ds.train.batch import to_compute_dtype


@torch.no_grad()
def evaluate(
    accelerator: Accelerator,
    task: Task,
    model: torch.nn.Module,
    eval_loader: DataLoader,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Run on EVERY rank (under ZeRO-3 each forward is a collective); returns `eval/*` metrics.

    `gather_for_metrics` drops the samples the distributed sampler duplicated to even out the last
    batch, so the metric covers the eval set exactly once whatever the world size.
    """
    was_training = model.training
    model.eval()
    collected: dict[str, list[torch.Tensor]] = {}
    for index, batch in enumerate(eval_loader):
        if max_batches is not None and index >= max_batches:
            break
        batch = to_compute_dtype(accelerator, batch, task.full_precision_keys)
        values: dict[str, Any] = task.eval_step(model, batch)
        values = accelerator.gather_for_metrics({k: v.detach() for k, v in values.items()})
        for name, value in values.items():
            collected.setdefault(name, []).append(value.float().reshape(-1).cpu())
    model.train(was_training)
    if not collected:
        return {}
    return task.summarize_eval({name: torch.cat(parts) for name, parts in collected.items()})
