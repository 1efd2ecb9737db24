"""Whether the training state in memory is finite, agreed by every rank, before it is saved or exported.

Why: a diverging run can turn its weights NaN/inf in an update whose loss was still finite (the loss
check only sees the NEXT step). A checkpoint written from those weights looked like any other: it was
counted against keep_last (pruning the good ones) and `resume=latest` picked it. Checking the state
when it is saved costs one fused reduction over tensors already in memory, far less than writing them.

Under ZeRO and FSDP2 each rank holds only its shard (a ZeRO-3 parameter's partition, the fp32 master partition
and its optimizer state), so each rank checks what it holds and the ranks agree with one all-reduce:
saving is a collective, and every rank must take the same branch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from framer_ds.engine.fsdp2 import local_shard
from framer_ds.engine.zero3_partitions import held_values, narrow_to, real_segments


def exchange_flags(accelerator: Accelerator, *flags: bool) -> list[bool]:
    """Whether ANY rank raised each flag (one all-reduce for all of them). Every rank."""
    local = torch.tensor([float(f) for f in flags], device=accelerator.device)
    if accelerator.num_processes > 1:
        local = accelerator.reduce(local, reduction="sum")
    return [bool(v > 0) for v in local.tolist()]


@dataclass(frozen=True)
class Finiteness:
    """What some rank found non-finite: the trainable weights, the optimizer state."""

    weights: bool
    optimizer: bool

    @property
    def ok(self) -> bool:
        return self.weights and self.optimizer

    def describe(self) -> str:
        """E.g. "the trainable weights are not finite (NaN/inf)"."""
        bad = [
            what
            for what, fine in (("trainable weights", self.weights), ("optimizer state", self.optimizer))
            if not fine
        ]
        verb = "are" if len(bad) > 1 or bad == ["trainable weights"] else "is"
        return "the " + " and the ".join(bad) + f" {verb} not finite (NaN/inf)"


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """True when no element of `tensors` is NaN or inf: one max-abs (the inf-norm: it cannot overflow
    the way a 2-norm or a sum of large finite values would, and NaN propagates through it) per tensor,
    fused per device with `torch._foreach_norm`, and one device sync per device."""
    by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for tensor in map(local_shard, tensors):  # an FSDP2 DTensor: this rank's shard
        if tensor.numel() and tensor.is_floating_point():  # an unsharded ZeRO-3 placeholder is empty
            by_device[tensor.device].append(tensor.detach())
    for group in by_device.values():
        norms = torch._foreach_norm(group, float("inf"))
        if not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
            return False
    return True


def trainable_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The trainable parameters as this rank holds them: under ZeRO-3 the real elements of its partition
    (`ds_tensor` without DeepSpeed's uninitialised padding, `engine.zero3_partitions`)."""
    return [held_values(p) for p in model.parameters() if p.requires_grad]


def optimizer_tensors(optimizer: object) -> list[torch.Tensor]:
    """The tensors of the innermost optimizer: its params and its state (Adam's moments).

    accelerate wraps the optimizer (`.optimizer`), and DeepSpeed's ZeRO optimizer wraps the torch one
    that steps this rank's fp32 master partition, so following `.optimizer` to the end reaches what
    this rank holds: the model's own parameters without ZeRO, the fp32 partition under ZeRO (on the CPU
    under optimizer offload). Under ZeRO-3 only the real elements of the fp32 partition and its moments:
    the padding past a parameter's end is uninitialised memory (`engine.zero3_partitions`)."""
    inner, seen, segments = optimizer, set(), {}
    while hasattr(inner, "optimizer") and id(inner) not in seen:
        seen.add(id(inner))
        segments.update(real_segments(inner))
        inner = inner.optimizer
    state = getattr(inner, "state", {})
    params = {id(p): p for group in getattr(inner, "param_groups", ()) for p in group["params"]}
    params.update({id(p): p for p in state})
    params.update({key: master for key, (master, _) in segments.items()})
    found: list[torch.Tensor] = []
    for key, param in params.items():
        parts = [param, *(part for value in state.get(param, {}).values() for part in _plain_parts(value))]
        if key not in segments:
            found += parts
            continue
        runs = segments[key][1]  # a ZeRO-3 master: its moments are shaped like it, a step count is a scalar
        found += [
            v for part in parts for v in (narrow_to(part, runs) if part.numel() == param.numel() else [part])
        ]
    return found


def _plain_parts(value: object) -> list[torch.Tensor]:
    """A plain tensor as itself; a tensor subclass (torchao's 8-bit Adam moments: uint8 codes and fp32
    scales, `train.optimizer.name=adamw_8bit`) as the plain tensors it is made of, which the fused norm
    can read: a NaN moment shows as a NaN scale."""
    if not isinstance(value, torch.Tensor):
        return []
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is None or type(value) is torch.nn.Parameter:
        return [value]
    return [part for name in flatten()[0] for part in _plain_parts(getattr(value, name))]


def agreed_finiteness(
    accelerator: Accelerator, model: torch.nn.Module, optimizer: object | None = None
) -> Finiteness:
    """Whether the trainable weights (and the optimizer state, when `optimizer` is given) are finite on
    EVERY rank; each rank checks its own shard. A collective: call on every rank."""
    weights_bad = not all_finite(trainable_tensors(model))
    optimizer_bad = optimizer is not None and not all_finite(optimizer_tensors(optimizer))
    weights_bad, optimizer_bad = exchange_flags(accelerator, weights_bad, optimizer_bad)
    return Finiteness(weights=not weights_bad, optimizer=not optimizer_bad)
