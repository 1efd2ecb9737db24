"""The dtype a run computes in, and the batch cast DeepSpeed needs because it runs no autocast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import recursively_apply

from framer_ds.engine.accelerator import uses_deepspeed
from framer_ds.engine.fsdp2 import uses_fsdp2


def compute_dtype(accelerator: Accelerator) -> torch.dtype:
    """The dtype the trained module computes in (DeepSpeed casts the module; DDP autocasts)."""
    return dtype_of(accelerator.mixed_precision)


def dtype_of(mixed_precision: str) -> torch.dtype:
    """'bf16' / 'fp16' / anything else (fp32) -> the torch dtype."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision, torch.float32)


def store_frozen_in_compute_dtype(accelerator: Accelerator, model: torch.nn.Module) -> int:
    """Plain and DDP runs under bf16/fp16: the frozen (requires_grad=False) parameters stored in the compute
    dtype, the trainable ones left as they are (fp32 masters); returns how many elements were cast.

    Why: DeepSpeed casts the whole module to the compute dtype, so a frozen base costs 2 bytes a weight
    there; the plain path kept it fp32 (4 bytes), and autocast then made a bf16 copy of every frozen
    weight each forward and kept it for backward: a frozen SVD UNet cost 3x its bf16 size, which is the
    15-26% the planner under-predicted plain video runs by on a GPU (docs/benchmarks.md, "GPU suite").
    Autocast computes in the compute dtype either way, so the forward is the same; exports are unchanged
    (tasks export trainable parameters, or merge into a base read from disk). FSDP2 keeps its own mixed
    precision policy and DeepSpeed its own cast: left alone."""
    dtype = compute_dtype(accelerator)
    if dtype == torch.float32 or uses_deepspeed(accelerator) or uses_fsdp2(accelerator):
        return 0
    cast = 0
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
            cast += param.numel()
    return cast


def to_compute_dtype(accelerator: Accelerator, batch: Any, keep: frozenset[str] = frozenset()) -> Any:
    """Cast floating tensors to bf16/fp16 under DeepSpeed; unchanged under DDP (autocast handles it).

    `keep`: keys of a dict batch left in full precision, for conditioning scalars (a noise strength,
    an fps) that bf16 would round while the activations gain nothing from the cast.
    """
    if not uses_deepspeed(accelerator):
        return batch
    return cast_batch(batch, compute_dtype(accelerator), keep)


def cast_batch(batch: Any, dtype: torch.dtype, keep: frozenset[str] = frozenset()) -> Any:
    """Every floating tensor of `batch` in `dtype`, but the `keep` keys of a dict batch."""
    if dtype == torch.float32:
        return batch
    if keep and isinstance(batch, Mapping):
        cast = cast_batch({k: v for k, v in batch.items() if k not in keep}, dtype)
        return {k: (v if k in keep else cast[k]) for k, v in batch.items()}
    return recursively_apply(
        lambda t: t.to(dtype),
        batch,
        test_type=lambda t: isinstance(t, torch.Tensor) and t.is_floating_point(),
    )
