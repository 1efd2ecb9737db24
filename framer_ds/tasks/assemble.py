"""The order of the phases that build what a run steps, written once: training (`train/run.py`) and
`framer-ds eval` (`train/evaluate_export.py`) both go through `assemble`.

Why one place: the order is a contract every task relies on - frozen helpers are on the device before
`precompute` encodes with them, the latent cache is filled before the trainable model takes its memory,
the seed is set after `prepare_data` (generating built-in data draws random numbers, and a run must not
depend on whether its data existed). Spelled out at each caller, the copies drifted (eval seeded
before preparing the data). Each phase returns what it builds; a later phase takes it as an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from framer_ds.engine.accelerator import frozen_model_init
from framer_ds.tasks.base import Task

if TYPE_CHECKING:
    from accelerate import Accelerator

PHASES = ("prepare_data", "build_datasets", "setup_frozen", "precompute", "build_model")
"""The `Task` methods `assemble` calls, in its order."""


@dataclass
class TaskParts:
    """What the phases built: the datasets training reads (after `precompute`) and the trainable model
    (before `accelerator.prepare`)."""

    train_set: Dataset
    eval_set: Dataset | None
    model: torch.nn.Module


def assemble(
    task: Task,
    accelerator: Accelerator,
    check_data: Callable[[Dataset, Dataset | None], None] | None = None,
) -> TaskParts:
    """Run the phases of `PHASES` on every rank. `check_data(train, eval)` runs right after
    `build_datasets`, before anything slow (loading frozen encoders, filling a cache): where a caller
    refuses the data (no eval set to keep the best of), it says so at once."""
    from accelerate.utils import set_seed

    # On the local main process while the others wait: building a model here under ZeRO-3 init would
    # start collectives the waiting ranks never join (a deadlock), hence frozen_model_init.
    with accelerator.local_main_process_first(), frozen_model_init(accelerator):
        task.prepare_data()
    set_seed(task.config.train.seed)
    train_set, eval_set = task.build_datasets()
    if check_data is not None:
        check_data(train_set, eval_set)
    task.setup_frozen(accelerator)
    train_set, eval_set = task.precompute(accelerator, train_set, eval_set)
    return TaskParts(train_set, eval_set, task.build_model())
