"""The elements of a ZeRO-3 partition that hold a parameter's values, without DeepSpeed's padding.

Why: ZeRO-3 gives every rank a partition of ceil(numel / world) elements of each parameter
(`param.ds_tensor`), so the ranks past the parameter's end hold padding. DeepSpeed allocates the
partition with `torch.empty` and copies only the real elements in (`_partition_param`), so the padding is
whatever the allocator's memory held: on a GPU's caching allocator and on a busy CPU heap, now and then
a NaN or inf bit pattern. The fp32 master partition and Adam's moments are built from the same
partitions, padding included. Nothing computes with the padding (a gather narrows to the parameter's
numel), but a check that reads the whole partition (`engine.finite`: is the state finite before a save?)
sees the garbage and stops a healthy run. Every reader of "what this rank holds" asks here for the real
elements instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def held_numel(param: torch.Tensor) -> int:
    """How many of `param`'s ZeRO-3 partition elements are real on this rank (the rest is padding)."""
    partition = param.ds_tensor.ds_numel
    group = getattr(param, "ds_process_group", None)
    rank = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
    return max(0, min(partition, param.ds_numel - rank * partition))


def held_values(param: torch.Tensor) -> torch.Tensor:
    """`param` as this rank holds it: under ZeRO-3 the real part of its partition, else itself."""
    partition = getattr(param, "ds_tensor", None)
    if partition is None:
        return param
    return partition.view(-1).narrow(0, 0, held_numel(param))


def real_segments(zero_optimizer: object) -> dict[int, tuple[torch.Tensor, list[tuple[int, int]]]]:
    """For a ZeRO-3 optimizer (DeepSpeedZeroOptimizer_Stage3): per fp32 master partition (keyed by `id`),
    the partition and the (offset, length) runs of its real elements. (The inner torch optimizer holds a
    master in its param groups only while it steps it; DeepSpeed empties them after.) The master
    partition of sub-group i concatenates its parameters' partitions in `fp16_groups[i]` order, each
    `partition_numel()` long. {} for any other optimizer; a sub-group whose master partition is not in
    memory (NVMe offload) is left out."""
    groups = getattr(zero_optimizer, "fp16_groups", None)
    masters = getattr(zero_optimizer, "fp32_partitioned_groups_flat", None)
    if groups is None or masters is None:
        return {}
    segments: dict[int, tuple[torch.Tensor, list[tuple[int, int]]]] = {}
    for params, master in zip(groups, masters, strict=False):
        if master is None or not master.numel():
            continue
        runs, offset = [], 0
        for param in params:
            if held := held_numel(param):
                runs.append((offset, held))
            offset += param.partition_numel()
        segments[id(master)] = (master, runs)
    return segments


def narrow_to(tensor: torch.Tensor, runs: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The runs of `tensor` (a master partition or a moment shaped like it) as flat views."""
    flat = tensor.view(-1)
    return [flat.narrow(0, start, length) for start, length in runs]
