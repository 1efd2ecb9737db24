"""One strategy's row of `framer-ds plan`: its peak per GPU at the configured micro-batch, the largest
micro-batch that fits, the accumulation for the global batch, and why it does not fit or is refused.

Why its own module: a row is the memory model (memory_model.py) read at the hardware's limits, the same
arithmetic whatever measured its inputs; the planner (planner.py) makes one row per strategy and picks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from framer_ds.engine.zero_buffers import resolve_auto
from framer_ds.lab.activation_probe import ActivationProbe
from framer_ds.lab.hardware import GiB, Hardware
from framer_ds.lab.memory_model import MemoryEstimate, ParameterCensus, estimate
from framer_ds.lab.micro_batch import MAX_MICRO_BATCH, largest_fitting, split_batch


@dataclass
class StrategyRow:
    """One strategy on the hardware: its peak at the configured micro-batch and the largest that fits."""

    strategy: str
    fits: bool
    device_bytes: int
    host_bytes_per_node: int
    largest_micro_batch: int
    """0: not even one sample fits."""
    largest_limited_by: str
    """What stops the micro-batch from growing: "memory", "data" (each rank's share of the training
    examples) or "search limit" (MAX_MICRO_BATCH: memory would allow more)."""
    micro_batch: int
    """The micro-batch this row runs at: the configured one, or the largest that fits below it."""
    accumulation: int
    global_batch: int
    note: str = ""
    terms: dict[str, int] = field(default_factory=dict)


def resolved_zero(strategy: str, census: ParameterCensus, deepspeed_dir: Path, hardware: Hardware) -> dict:
    """The strategy's `zero_optimization` with "auto" replaced as the engine replaces it."""
    if strategy in ("ddp", "fsdp2"):
        return {}
    path = deepspeed_dir / f"{strategy}.json"
    try:
        zero = dict(json.loads(path.read_text()).get("zero_optimization", {}))
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"{path}: {exc}; run from the repository root or pass --deepspeed-dir"
        ) from None
    resolve_auto(zero, census.auto_buffers, hardware.gpus_per_node)
    return zero


def strategy_row(
    strategy: str,
    census: ParameterCensus,
    probe: ActivationProbe,
    hardware: Hardware,
    mixed_precision: str,
    zero: dict,
    micro_batch: int,
    global_batch: int,
    limit: tuple[int, str] = (MAX_MICRO_BATCH, "search limit"),
) -> StrategyRow:
    def memory(k: int) -> MemoryEstimate:
        accumulation = split_batch(global_batch, hardware.world, k)[1]
        return estimate(
            strategy,
            census,
            hardware.world,
            mixed_precision,
            probe.at(k),
            zero,
            probe.eval_transient,
            accumulation,
        )

    def host_per_node(found: MemoryEstimate) -> int:
        return found.peak("host") * hardware.gpus_per_node

    def within(found: MemoryEstimate) -> bool:
        host_ok = hardware.cpu_bytes is None or host_per_node(found) <= hardware.cpu_bytes
        return found.peak("device") <= hardware.usable and host_ok

    largest = largest_fitting(lambda k: within(memory(k)), limit[0])
    limited_by = limit[1] if largest == limit[0] else "memory"
    runs_at, accumulation = split_batch(
        global_batch, hardware.world, min(micro_batch, largest) or micro_batch
    )
    found = memory(micro_batch)
    note = ""
    if strategy == "zeropp" and hardware.nodes == 1:
        note = "ZeRO++ pays off across nodes; on one node ZeRO-3 is as fast without the secondary copy"
    phases = found.phases("device")
    if phases["eval"] > max(phases["backward"], phases["step"]):
        note = (
            "the evaluation phase is this row's peak: helpers back on the device and what sampling "
            "computes (lower model.samples.decode_chunk_size, or check it with framer-ds bench)"
        )
    if strategy == "fsdp2" and hardware.world == 1:
        note = "FSDP2 shards over 2+ processes; on one it trains unsharded (`framer-ds validate` refuses it)"
    if hardware.cpu_bytes is not None and host_per_node(found) > hardware.cpu_bytes:
        note = f"needs {host_per_node(found) / GiB:.1f} GiB of host memory per node"
    refused = lever_refusal(strategy, census)
    note = refused or note
    return StrategyRow(
        strategy=strategy,
        fits=within(found) and not (strategy == "fsdp2" and hardware.world == 1) and not refused,
        device_bytes=found.peak("device"),
        host_bytes_per_node=host_per_node(found),
        largest_micro_batch=largest,
        largest_limited_by=limited_by,
        micro_batch=runs_at,
        accumulation=accumulation,
        global_batch=runs_at * accumulation * hardware.world,
        note=note,
        terms=found.by_name(),
    )


def lever_refusal(strategy: str, census: ParameterCensus) -> str:
    """Why `framer-ds validate` refuses this strategy with the config's fit levers, or "": an int8/fp8
    base runs plain/DDP only, 8-bit Adam states not under DeepSpeed (config/deepspeed_json_rules.py,
    config/fsdp_yaml_rules.py)."""
    if census.quantized_frozen_bytes and strategy != "ddp":
        return "refused: a quantized base (model.base_precision) trains plain/DDP only"
    if census.optimizer_state_bytes is not None and strategy not in ("ddp", "fsdp2"):
        return "refused: DeepSpeed owns the optimizer states (train.optimizer.name=adamw_8bit)"
    return ""
