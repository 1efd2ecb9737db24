"""Batch dtype handling: DeepSpeed runs no autocast, so floating inputs are cast to the engine dtype."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import recursively_apply

from framer_ds.engine.accelerator import compute_dtype, uses_deepspeed


def to_compute_dtype(accelerator: Accelerator, batch: Any) -> Any:
    """Cast floating tensors to bf16/fp16 under DeepSpeed; unchanged under DDP (autocast handles it)."""
    if not uses_deepspeed(accelerator):
        return batch
    dtype = compute_dtype(accelerator)
    if dtype == torch.float32:
        return batch
    return recursively_apply(
        lambda t: t.to(dtype),
        batch,
        test_type=lambda t: isinstance(t, torch.Tensor) and t.is_floating_point(),
    )
