"""DeepSpeed's communication buffers sized from what this run trains, not from a 175B-model default.

Why: a DeepSpeed JSON states its buffers in elements, fixed per file. ZeRO-2 allocates
`reduce_bucket_size` in full (twice with `overlap_comm`) whatever the number of trainable parameters:
the common 5e8 is 3.7 GiB per rank in fp32 for a LoRA whose weights are 17 MiB, so ZeRO used more
memory than DDP. ZeRO-3's `stage3_max_reuse_distance` of 1e9 keeps every parameter gathered from its
forward use until backward - the whole model on every rank, which is what sharding was meant to
avoid. accelerate's own "auto" needs `model.config.hidden_size` (UNets have none) and ignores LoRA.

So the shipped JSONs say "auto" for these fields and `size_zero_buffers` resolves them from the model
that goes through `prepare`, before it does; an explicit number is kept and only warned about when it
is far larger than what is trained. The rules, in elements (docs/distributed.md has the table):

- reduce / all-gather bucket: an eighth of the trainable parameters, at least 2^20 (or all of them
  when fewer), at most 48 x 2^20 (~5e7): several buckets per step keep communication overlapped
  with backward.
- ZeRO-3 prefetch bucket: the same rule over all parameters (frozen ones are gathered for forward too).
- ZeRO-3 max live parameters and max reuse distance: twice the prefetch bucket, at least twice the
  largest parameter, so a layer stays gathered through its own recomputation but the model is released
  between forward and backward.
- ZeRO-3 persistence threshold: parameters at or below it stay whole on every rank (no gather latency
  for biases and norms); the largest threshold whose persistent parameters stay within 1% of the
  model, at most DeepSpeed's default 1e5.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from framer_ds.config.zero_fields import (
    ALLGATHER,
    AUTO_BUCKET_CAP,
    HPZ,
    MAX_LIVE,
    PERSISTENCE,
    PREFETCH,
    REDUCE,
    REUSE,
    ZERO_BUFFER_KEYS,
    bucket_bytes,
    element_bytes,
    is_element_count,
)

BUCKET_FLOOR = 2**20
BUCKET_SHARE = 8  # an eighth of the parameters per bucket
PERSISTENT_SHARE = 0.01
PERSISTENCE_CAP = 100_000
ALIGN = 4096  # DeepSpeed wants all-gather buckets aligned; round every value to whole pages of elements
OVERSIZED_FACTOR = 10


@dataclass(frozen=True)
class ParameterSizes:
    """What the buffer rules look at: element counts of the model that goes through `prepare`."""

    trainable: int
    total: int
    largest: int
    numels: tuple[int, ...] = field(repr=False)

    @classmethod
    def of(cls, model: torch.nn.Module) -> ParameterSizes:
        # ZeRO-3 built with zero.Init leaves (0,)-shaped locals; ds_numel is the full size.
        counted = [(int(getattr(p, "ds_numel", p.numel())), p.requires_grad) for p in model.parameters()]
        numels = tuple(n for n, _ in counted)
        return cls(
            trainable=sum(n for n, trains in counted if trains),
            total=sum(numels),
            largest=max(numels, default=0),
            numels=numels,
        )


def _round_up(value: float) -> int:
    return math.ceil(max(value, 1) / ALIGN) * ALIGN


def bucket_for(parameters: int) -> int:
    """One bucket for `parameters` elements: an eighth of them within [2^20, 48 x 2^20], never more than
    all of them (rounded up to ALIGN)."""
    share = min(max(parameters / BUCKET_SHARE, BUCKET_FLOOR), AUTO_BUCKET_CAP)
    return _round_up(min(share, parameters))


def persistence_threshold(numels: Iterable[int], total: int) -> int:
    """The largest per-parameter threshold whose persistent parameters (numel <= it) sum to at most 1% of
    the model, capped at DeepSpeed's default."""
    budget, kept, threshold = PERSISTENT_SHARE * total, 0, 0
    for numel, count in sorted(Counter(numels).items()):  # every parameter of a size persists, or none
        if numel > PERSISTENCE_CAP or kept + numel * count > budget:
            break
        kept += numel * count
        threshold = numel
    return threshold


def auto_values(sizes: ParameterSizes) -> dict[str, int]:
    """What "auto" means for each buffer field, for this model."""
    bucket = bucket_for(sizes.trainable)
    prefetch = bucket_for(sizes.total)
    live = _round_up(max(2 * prefetch, 2 * sizes.largest))
    return {
        REDUCE: bucket,
        ALLGATHER: bucket,
        PREFETCH: prefetch,
        PERSISTENCE: persistence_threshold(sizes.numels, sizes.total),
        MAX_LIVE: live,
        REUSE: live,
    }


@dataclass
class ZeroBuffers:
    """The buffer fields as the engine will run them, which were "auto", and warnings for the rest."""

    values: dict[str, int]
    auto: tuple[str, ...]
    warnings: list[str]

    def describe(self) -> str:
        """The run summary's line: every buffer field, (auto) after the ones resolved here."""
        return ", ".join(
            f"{key} {value:,}{' (auto)' if key in self.auto else ''}" for key, value in self.values.items()
        )


def oversized_warnings(zero: Mapping[str, Any], sizes: ParameterSizes, bytes_per_element: int) -> list[str]:
    """Explicit values that allocate or keep far more than the model needs, each with its cost and fix."""
    out = []
    reduce = zero.get(REDUCE)
    if is_element_count(reduce) and reduce > OVERSIZED_FACTOR * max(sizes.trainable, 1):
        cost = bucket_bytes(zero, int(reduce), bytes_per_element) / 2**30
        out.append(
            f"{REDUCE} {reduce:.3g} allocates {cost:.1f} GiB per rank for {sizes.trainable / 1e6:.3g}M "
            f'trainable parameters; use "auto" (sizes it from what is trained: '
            f"{bucket_for(sizes.trainable):,})"
        )
    reuse = zero.get(REUSE)
    if zero.get("stage") == 3 and is_element_count(reuse) and reuse >= sizes.total:
        out.append(
            f"{REUSE} {reuse:.3g} >= the model's {sizes.total / 1e6:.3g}M parameters keeps every parameter "
            f'gathered from forward to backward (the whole model on every rank); use "auto"'
        )
    return out


def resolve_auto(
    zero: dict[str, Any], resolved: Mapping[str, int], processes_per_node: int
) -> tuple[str, ...]:
    """Replace, in place, every "auto" buffer field of a `zero_optimization` section with its value in
    `resolved` (`auto_values`), and hpZ's "auto" with `processes_per_node`; returns the keys replaced.
    The engine before `prepare` and the planner (for any hardware) resolve a JSON the same way."""
    auto = tuple(key for key in ZERO_BUFFER_KEYS if zero.get(key) == "auto")
    for key in auto:
        zero[key] = resolved[key]
    if zero.get(HPZ) == "auto":
        zero[HPZ], auto = processes_per_node, (*auto, HPZ)
    return auto


def size_zero_buffers(
    deepspeed_config: dict[str, Any], sizes: ParameterSizes, mixed_precision: str, processes_per_node: int = 1
) -> ZeroBuffers:
    """Replace every "auto" buffer field in `deepspeed_config["zero_optimization"]` in place, and report.

    Must run before `accelerator.prepare`: accelerate would otherwise try its hidden_size rule (and fail
    without one) and DeepSpeed reads the values when the engine is built. `mixed_precision` (the
    training YAML's; the JSON's own bf16/fp16 are still "auto" here) sets the bucket element size.
    ZeRO++'s `zero_hpz_partition_size` "auto" becomes `processes_per_node`."""
    zero = deepspeed_config.setdefault("zero_optimization", {})
    warnings = oversized_warnings(zero, sizes, element_bytes(mixed_precision))
    auto = resolve_auto(zero, auto_values(sizes), processes_per_node)
    stage3 = zero.get("stage") == 3
    shown = [
        key for key in (*ZERO_BUFFER_KEYS, HPZ) if key in zero and (stage3 or not key.startswith("stage3_"))
    ]
    return ZeroBuffers({key: int(zero[key]) for key in shown}, auto, warnings)
