"""Per-rank memory of one training step under each strategy, as named terms (what `framer-ds plan` adds up).

Why our own model: DeepSpeed's estimators count frozen parameters as trainable (a LoRA looks like a full
fine-tune) and leave out the buffers that decide whether a run fits - the reduce buckets, ZeRO-3's
gathered working set, the step's temporary gradient copies. Each term below follows what DeepSpeed
0.19 allocates (read from stage_1_and_2.py, stage3.py and partition_parameters.py), applied to what is
TRAINED: frozen parameters cost their weights only, sharded or whole as the stage dictates.

Symbols: T trainable and F frozen elements in the model that goes through `prepare`, H bytes of frozen
helpers outside it (VAE, encoders: whole on every rank), N ranks, b bytes per element of the model
dtype (2 in bf16/fp16, 4 in fp32), P = T / N the trainable partition, R the reduce bucket (elements),
L the largest trainable parameter. A term lives on the device or on the host, and either for the whole
run (persistent) or only in backward, in the optimizer step, or in evaluation (helpers brought back
and what sampling computes, between steps); the peak is the persistent terms plus the largest of the
three phases. Activations and the evaluation transient are inputs: they are measured, not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from framer_ds.config.zero_fields import MAX_LIVE, PERSISTENCE, REDUCE, bucket_bytes, element_bytes

Where = Literal["device", "host"]
Phase = Literal["persistent", "backward", "step", "eval"]

FP32 = 4
ADAM_STATES = 2  # exp_avg and exp_avg_sq, fp32 each
STRATEGIES = ("ddp", "zero2", "zero2_offload", "zero3", "zero3_offload", "zeropp", "fsdp2")


@dataclass(frozen=True)
class ParameterCensus:
    """Element counts of the model that goes through `prepare`, and the bytes of frozen helpers beside it."""

    trainable: int
    frozen: int
    largest_trainable: int
    persistent_small: int = 0
    """Elements of the parameters at or below ZeRO-3's persistence threshold (kept whole on every rank)."""
    helper_bytes: int = 0
    eval_helper_bytes: int = 0
    """Frozen helpers on the device only while evaluating or sampling (a VAE the latent cache keeps off
    the device in training), in the dtypes they run in."""
    frozen_bytes_per_element: int = FP32
    """DDP keeps frozen weights in the dtype the task loaded them in; DeepSpeed casts them to the model
    dtype."""
    auto_buffers: Mapping[str, int] = field(default_factory=dict)
    """What "auto" resolves to for each DeepSpeed buffer field, for this model (engine.zero_buffers)."""
    largest_fsdp_unit: int = 0
    """Elements of the largest FSDP2 unit: one of the task's repeated blocks (`Task.fsdp_block_classes`)
    or the root's remainder; 0 when unknown (then the whole model counts as one unit)."""
    quantized_frozen_bytes: int = 0
    """model.base_precision int8/fp8: the frozen Linear weights as stored (1 byte each plus a 4-byte scale
    and a 1-byte zero point per output row); those elements are not in `frozen`."""
    optimizer_state_bytes: int | None = None
    """train.optimizer.name=adamw_8bit: both moments of every trainable tensor as torchao stores them
    (engine.optim8bit.state_bytes); None: fp32 Adam, 8 bytes per trainable element."""

    def adam_bytes(self, shards: int = 1) -> int:
        """The optimizer states of the trainable elements, over `shards` ranks."""
        whole = ADAM_STATES * FP32 * self.trainable if self.optimizer_state_bytes is None else None
        return _ceil_div(whole if whole is not None else self.optimizer_state_bytes, shards)

    @property
    def adam_label(self) -> str:
        return "fp32 Adam" if self.optimizer_state_bytes is None else "8-bit Adam"


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    where: Where
    phase: Phase


@dataclass(frozen=True)
class MemoryEstimate:
    strategy: str
    terms: tuple[Term, ...]

    def peak(self, where: Where | None = "device") -> int:
        """Persistent terms plus the largest phase (backward with the activations, the optimizer step, or
        evaluation). `where=None`: device and host together, as on a CPU run where they are the same
        memory."""
        parts = self.phases(where)
        return parts["persistent"] + max(parts["backward"], parts["step"], parts["eval"])

    def phases(self, where: Where | None = "device") -> dict[str, int]:
        parts = {"persistent": 0, "backward": 0, "step": 0, "eval": 0}
        for term in self.terms:
            if where is None or term.where == where:
                parts[term.phase] += term.bytes
        return parts

    def by_name(self) -> dict[str, int]:
        return {term.name: term.bytes for term in self.terms}


def estimate(
    strategy: str,
    census: ParameterCensus,
    world_size: int,
    mixed_precision: str,
    activation_bytes: int,
    zero: Mapping[str, Any] | None = None,
    eval_bytes: int = 0,
    accumulation: int = 1,
) -> MemoryEstimate:
    """The terms of `strategy` on each of `world_size` ranks. `zero` is the resolved `zero_optimization`
    section (numbers, not "auto": engine.zero_buffers resolves them from the same census); `eval_bytes`
    the measured peak of what evaluation computes (`PlanningHooks.eval_transient`); `accumulation` the
    micro-batches per optimizer step (FSDP2 keeps whole gradients between them)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    zero = dict(zero or {})
    common = [
        Term("activations", activation_bytes, "device", "backward"),
        Term("frozen helpers", census.helper_bytes, "device", "persistent"),
        Term("helpers back for evaluation", census.eval_helper_bytes, "device", "eval"),
        Term("evaluation transient", eval_bytes, "device", "eval"),
    ]
    if strategy == "ddp":
        terms = _ddp(census, mixed_precision)
    elif strategy == "fsdp2":
        terms = _fsdp2(census, world_size, element_bytes(mixed_precision), accumulation)
    elif strategy.startswith("zero2"):
        terms = _zero2(census, world_size, element_bytes(mixed_precision), zero, strategy.endswith("offload"))
    else:
        terms = _zero3(census, world_size, element_bytes(mixed_precision), zero, strategy)
    return MemoryEstimate(strategy, tuple(t for t in (*common, *terms) if t.bytes > 0))


def _ddp(census: ParameterCensus, mixed_precision: str) -> list[Term]:
    """accelerate's DDP keeps fp32 weights and gradients (the gradients are views into the all-reduce
    buckets, gradient_as_bucket_view) and fused AdamW's two states; autocast caches a bf16/fp16 copy of
    every trainable weight it casts, from forward to the end of backward. Under bf16/fp16 the frozen
    weights are stored in that dtype (engine.precision.store_frozen_in_compute_dtype), as under DeepSpeed,
    so autocast copies none of them."""
    t = census.trainable
    mixed = mixed_precision in ("bf16", "fp16")
    autocast = element_bytes(mixed_precision) if mixed else 0
    frozen_b = element_bytes(mixed_precision) if mixed else census.frozen_bytes_per_element
    return [
        Term("trainable weights (fp32)", FP32 * t, "device", "persistent"),
        Term("frozen weights", frozen_b * census.frozen, "device", "persistent"),
        Term("frozen weights (quantized)", census.quantized_frozen_bytes, "device", "persistent"),
        Term("gradients (fp32, in the DDP buckets)", FP32 * t, "device", "persistent"),
        Term(f"optimizer states ({census.adam_label})", census.adam_bytes(), "device", "persistent"),
        Term("autocast weight copies", autocast * t, "device", "backward"),
    ]


def _zero2(census: ParameterCensus, n: int, b: int, zero: Mapping[str, Any], offload: bool) -> list[Term]:
    """ZeRO-2: every rank keeps the whole model in b; the fp32 master copy (a clone even in fp32 training),
    the gradients and the Adam states are partitioned. The reduce buckets exist during backward, two of
    them with overlap_comm and contiguous gradients (which offload forces on). With the optimizer offloaded,
    master, fp32 gradients, a b staging copy and the states live on the host."""
    t, p = census.trainable, _ceil_div(census.trainable, n)
    optimizer: Where = "host" if offload else "device"
    terms = [
        Term("trainable weights", b * t, "device", "persistent"),
        Term("frozen weights", b * census.frozen, "device", "persistent"),
        Term("frozen weights (quantized)", census.quantized_frozen_bytes, "device", "persistent"),
        Term("fp32 master partition", FP32 * p, optimizer, "persistent"),
        Term("optimizer states partition (fp32 Adam)", ADAM_STATES * FP32 * p, optimizer, "persistent"),
        Term("reduce buckets", _reduce_buckets({**zero, "stage": 2}, b, offload), "device", "backward"),
        Term("a parameter's gradient before bucketing", b * census.largest_trainable, "device", "backward"),
    ]
    if offload:
        terms += [
            Term("fp32 gradient partition", FP32 * p, "host", "persistent"),
            Term("gradient staging copy", b * p, "host", "persistent"),
            Term("offload transfer buffer", b * census.largest_trainable, "device", "persistent"),
            Term("offload transfer buffer", b * census.largest_trainable, "host", "persistent"),
        ]
    else:
        cast = FP32 * p if b != FP32 else 0  # .to(fp32) of an fp32 tensor is the tensor itself
        terms += [
            Term("gradient partition", b * p, "device", "persistent"),
            Term("flattened gradient partition", b * p, "device", "step"),
            Term("fp32 gradient partition", cast, "device", "step"),
        ]
    return terms


def _zero3(census: ParameterCensus, n: int, b: int, zero: Mapping[str, Any], strategy: str) -> list[Term]:
    """ZeRO-3: every parameter, frozen ones too, is partitioned; small ones (persistence threshold) stay
    whole on every rank; the parameters of the running module and what prefetch and reuse keep (at most
    max_live elements) are gathered in b. One reduce bucket and the b gradient partition exist from the
    start; reducing a bucket interleaves the ranks' slices of its gradients into a flat copy before the
    reduce-scatter (coalesced_collectives.reduce_scatter_coalesced: torch.cat), up to one more bucket (or
    all trainable elements, if fewer) in backward. The fp32 master is a copy even when training in fp32
    (measured on ViT-B: 163 MiB per rank beside the 163 MiB fp32 partition at 2 ranks). Without optimizer
    offload the step flattens the gradient partition (and casts it to fp32 when b is not); with it the
    reduced gradients are copied straight into an fp32 gradient partition on the host that lives for the
    whole run (stage3.initialize_optimizer_states), and the step makes no copy. zero3_offload (the shipped
    JSON) offloads parameters and optimizer; zeropp adds hpZ's secondary partition (1/h of the model per
    rank, `zero_hpz_partition_size` h)."""
    t, f = census.trainable, census.frozen
    total, p = t + f, _ceil_div(t, n)
    offload_opt = bool(zero.get("offload_optimizer", {}).get("device") in ("cpu", "nvme"))
    offload_par = bool(zero.get("offload_param", {}).get("device") in ("cpu", "nvme"))
    if strategy == "zero3_offload":
        offload_opt = offload_par = True
    optimizer: Where = "host" if offload_opt else "device"
    params: Where = "host" if offload_par else "device"
    live = min(int(zero.get(MAX_LIVE, total)), total)
    persistent = census.persistent_small if int(zero.get(PERSISTENCE, 0)) > 0 else 0
    hpz = int(zero.get("zero_hpz_partition_size", 1))
    secondary = b * _ceil_div(total, hpz) if hpz > 1 else 0
    bucket = _reduce_buckets({**zero, "stage": 3}, b, offload_opt)
    terms = [
        Term("trainable weights partition", b * p, params, "persistent"),
        Term("frozen weights partition", b * _ceil_div(f, n), params, "persistent"),
        Term("persistent small parameters (whole)", b * persistent, "device", "persistent"),
        Term("gathered parameters (max live)", b * live, "device", "backward"),
        Term("gradient partition", b * p, optimizer, "persistent"),
        Term("reduce bucket", bucket, "device", "persistent"),
        Term("reduce-scatter copy of the bucket", b * min(int(zero.get(REDUCE, 0)), t), "device", "backward"),
        Term("fp32 master partition", FP32 * p, optimizer, "persistent"),
        Term("optimizer states partition (fp32 Adam)", ADAM_STATES * FP32 * p, optimizer, "persistent"),
        Term("hpZ secondary partition", secondary, "device", "persistent"),
    ]
    if offload_opt:
        terms.append(Term("fp32 gradient partition", FP32 * p, "host", "persistent"))
    else:
        cast = FP32 * p if b != FP32 else 0
        terms += [
            Term("flattened gradient partition", b * p, "device", "step"),
            Term("fp32 gradient partition", cast, "device", "step"),
        ]
    return terms


def _fsdp2(census: ParameterCensus, n: int, b: int, accumulation: int) -> list[Term]:
    """FSDP2 (torch `fully_shard` through accelerate): every parameter, frozen ones too, is a DTensor
    shard (dim 0 cut over the N ranks); trainable ones are kept in fp32 (accelerate upcasts them under
    mixed precision; MixedPrecisionPolicy casts to b on the all-gather), and so are their sharded
    gradients and Adam states. In forward and backward one unit is gathered in b while the next is
    prefetched, and a unit's whole gradients exist until its reduce-scatter. Inside an accumulation
    window accelerate turns the gradient sync off (`set_requires_gradient_sync(False)`), so every
    trainable parameter's gradient stays whole (fp32) until the window's last backward: with
    accumulation FSDP2 keeps DDP's gradient memory."""
    t, f = census.trainable, census.frozen
    unit = census.largest_fsdp_unit or (t + f)
    p = _ceil_div(t, n)
    return [
        Term("trainable weights shard (fp32)", FP32 * p, "device", "persistent"),
        Term(
            "frozen weights shard", census.frozen_bytes_per_element * _ceil_div(f, n), "device", "persistent"
        ),
        Term("gradient shard (fp32)", FP32 * p, "device", "persistent"),
        Term(f"optimizer states shard ({census.adam_label})", census.adam_bytes(n), "device", "persistent"),
        Term("gathered unit + the prefetched next", 2 * b * unit, "device", "backward"),
        Term("a unit's gradients before reduce-scatter", FP32 * min(unit, t), "device", "backward"),
        Term(
            "whole gradients kept across accumulation",
            FP32 * t if accumulation > 1 else 0,
            "device",
            "backward",
        ),
    ]


def _reduce_buckets(zero: Mapping[str, Any], b: int, offload: bool) -> int:
    """The reduce buckets' bytes (zero_fields.bucket_bytes: two with overlap_comm in ZeRO-1/2, one in
    ZeRO-3); DeepSpeed allocates them only with contiguous gradients, which optimizer offload forces on."""
    if not (offload or zero.get("contiguous_gradients", True)):
        return 0
    return bucket_bytes({**zero, "contiguous_gradients": True}, int(zero.get(REDUCE, 0)), b)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // max(b, 1))
