"""How many optimizer steps a run takes, computed before `prepare` so the LR schedule can be built:
the run's length and its warmup (Cadences: steps, epochs or a share of the run) are resolved here, once
the data and the number of processes are known, so a config means the same on 1, 2 or 16 processes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.schema import TrainConfig


@dataclass(frozen=True)
class StepPlan:
    batches_per_epoch: int  # micro-batches per rank per epoch
    updates_per_epoch: int  # optimizer steps per epoch
    total_steps: int
    global_batch: int  # samples per optimizer step across all ranks
    warmup_steps: int = 0  # train.lr_schedule.warmup in optimizer steps


def plan_steps(num_samples: int, train: TrainConfig, world_size: int) -> StepPlan:
    """Mirror accelerate's sharding (drop_last=True: full batches split evenly across ranks)."""
    batches_per_epoch = (num_samples // train.micro_batch_size) // world_size
    if batches_per_epoch == 0:
        raise ConfigError(
            [
                ConfigProblem(
                    "train.micro_batch_size",
                    f"the training set has {num_samples} samples, fewer than micro_batch_size "
                    f"({train.micro_batch_size}) x processes ({world_size}); "
                    "lower the batch size or add data",
                )
            ]
        )
    updates_per_epoch = math.ceil(batches_per_epoch / train.gradient_accumulation_steps)
    total = train.length.resolve(updates_per_epoch)
    warmup = train.lr_schedule.warmup
    return StepPlan(
        batches_per_epoch,
        updates_per_epoch,
        total,
        train.global_batch_size(world_size),
        warmup_steps=warmup.resolve(updates_per_epoch, total) if warmup is not None else 0,
    )
