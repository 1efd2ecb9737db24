"""The learning-rate schedule: linear warmup from 0, then cosine, linear or no decay.

The multipliers are transformers' (`get_cosine_schedule_with_warmup`, `get_linear_schedule_with_warmup`,
`get_constant_schedule_with_warmup`), written here with the same arithmetic so every value is bit for bit
theirs (tests/train/test_lr_schedule.py compares them). Why not call `transformers.get_scheduler`:
`transformers.optimization` imports `trainer_utils`, which imports all of peft and transformers' model
code, ~4 s of CPU on every rank of every launch for tasks that use neither; and its "constant" silently
ignores `num_warmup_steps`, so a warmup did nothing with `train.lr_schedule.name: constant`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

ScheduleKind = Literal["cosine", "linear", "constant"]


def _warmup(step: int, warmup_steps: int) -> float:
    return float(step) / float(max(1, warmup_steps))


def _cosine(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def _linear(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def _constant(step: int, *, warmup_steps: int, total_steps: int) -> float:
    del total_steps  # no decay
    return _warmup(step, warmup_steps) if step < warmup_steps else 1.0


_MULTIPLIERS = {"cosine": _cosine, "linear": _linear, "constant": _constant}


def build_lr_scheduler(
    kind: ScheduleKind, optimizer: Optimizer, warmup_steps: int, total_steps: int
) -> LambdaLR:
    """A LambdaLR over `optimizer` (resume re-applies the config's learning rate through its lambdas).

    The lambdas are `functools.partial` objects of module-level functions, so `save_state` pickles the
    scheduler's state without the closures a lambda would need."""
    multiplier = partial(_MULTIPLIERS[kind], warmup_steps=warmup_steps, total_steps=total_steps)
    return LambdaLR(optimizer, multiplier)
