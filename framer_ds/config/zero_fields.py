"""DeepSpeed's ZeRO buffer fields: their names, what a bucket costs, and the largest bucket framer_ds's
"auto" ever picks. Shared by the launch checks (no model yet: `validate` can only compare against that
cap) and `engine.zero_buffers` (which sizes the fields from the model at start)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REDUCE = "reduce_bucket_size"
ALLGATHER = "allgather_bucket_size"
PREFETCH = "stage3_prefetch_bucket_size"
PERSISTENCE = "stage3_param_persistence_threshold"
MAX_LIVE = "stage3_max_live_parameters"
REUSE = "stage3_max_reuse_distance"
ZERO_BUFFER_KEYS = (REDUCE, ALLGATHER, PREFETCH, PERSISTENCE, MAX_LIVE, REUSE)
"""Fields in elements; "auto" is resolved from the trained model by engine.zero_buffers."""

HPZ = "zero_hpz_partition_size"
"""ZeRO++'s hierarchical partition: ranks holding a secondary copy of the weights; "auto" = the
processes of one node, so weight gathers in backward stay inside the node."""

AUTO_BUCKET_CAP = 48 * 2**20
"""The largest bucket "auto" picks (~5e7 elements, a 7B full fine-tune); anything above it is big for
every model."""


def is_element_count(value: Any) -> bool:
    """A value DeepSpeed takes for a buffer field: a whole, non-negative number (bools are not)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and value >= 0 and value == int(value)


def element_bytes(mixed_precision: str) -> int:
    """Bytes per gradient element in the buckets: DeepSpeed reduces in the compute dtype."""
    return 2 if mixed_precision in ("bf16", "fp16") else 4


def bucket_bytes(zero: Mapping[str, Any], elements: int, bytes_per_element: int) -> int:
    """Memory the reduce buckets take per rank: ZeRO-1/2 double-buffer them with `overlap_comm` and
    contiguous gradients; ZeRO-3 keeps one."""
    double = zero.get("overlap_comm", False) and zero.get("contiguous_gradients", True)
    copies = 2 if double and zero.get("stage") != 3 else 1
    return copies * elements * bytes_per_element


def fixed_bucket_warning(zero: Mapping[str, Any], mixed_precision: str) -> str | None:
    """Before any model exists: an explicit reduce bucket larger than "auto" picks for ANY model, with
    what it allocates per rank whatever is trained."""
    reduce = zero.get(REDUCE)
    if not is_element_count(reduce) or reduce <= AUTO_BUCKET_CAP:
        return None
    cost = bucket_bytes(zero, int(reduce), element_bytes(mixed_precision)) / 2**30
    return (
        f'{REDUCE} {reduce:.3g} allocates {cost:.1f} GiB per rank whatever is trained; "auto" sizes it '
        f"from the trainable parameters (at most {AUTO_BUCKET_CAP:.3g})"
    )
