"""What `framer-ds plan` reads from its flags and prints: sizes ("40GB"), byte counts for people, and the
table.

Why its own module: the planner (planner.py) computes a `Plan`; turning it into text, and text into
bytes, is the command line's side of it and changes for other reasons (wording, columns).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from framer_ds.lab.hardware import ALLOWANCE_FIXED, ALLOWANCE_SHARE, GiB

if TYPE_CHECKING:
    from framer_ds.lab.planner import Plan


def parse_bytes(text: str) -> int:
    """'40GB', '80GiB', '512G', '24000MB' -> bytes. GB and GiB both mean 2^30 (as nvidia-smi's MiB)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 40GB, 80GiB or 512G")
    power = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024**power)


def gib(value: int) -> str:
    """GiB from 1 GiB up, MiB below (a LoRA's terms are a few MiB)."""
    return f"{value / GiB:.2f} GiB" if abs(value) >= GiB else f"{value / 2**20:.1f} MiB"


def format_plan(plan: Plan) -> str:
    """The table `framer-ds plan` prints."""
    hw, census = plan.hardware, plan.census
    lines = [
        f"plan for {plan.config}{' ' + ' '.join(plan.overrides) if plan.overrides else ''}",
        f"hardware: {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s), {gib(hw.gpu_bytes)} each; "
        f"{gib(hw.usable)} usable after a {gib(hw.allowance)} allowance (CUDA context and kernels "
        f"{gib(ALLOWANCE_FIXED)} + {ALLOWANCE_SHARE:.0%} for allocator fragmentation)"
        + (f"; host {gib(hw.cpu_bytes)} per node" if hw.cpu_bytes else ""),
        *plan.assumptions,
        f"parameters: {census.trainable:,} trainable, {census.frozen:,} frozen"
        + (f" (+ quantized Linear weights: {gib(q)})" if (q := census.quantized_frozen_bytes) else "")
        + (f"; frozen helpers on every GPU: {gib(census.helper_bytes)}" if census.helper_bytes else ""),
    ]
    for name, probe in plan.activations.items():
        state = "on" if probe.gradient_checkpointing else "off"
        depth = (
            f", {' and '.join(map(str, probe.depth[:-1]))} of {probe.depth[-1]} blocks" if probe.depth else ""
        )
        lines.append(
            f"activations ({name}, gradient checkpointing {state}; measured on {probe.device} with fake "
            f"tensors{depth}): {gib(probe.at(1))} at micro-batch 1 + {gib(probe.per_sample)} per added "
            "sample"
        )  # not "fixed + per sample": a view at batch 1 that batch 2 must copy makes a fitted fixed part < 0
    if plan.inputs_cache is not None and plan.inputs_cache.hit:
        lines.append(
            f"(census and activations read from {plan.inputs_cache.path}, measured by an earlier plan of the "
            "same config, files and framer_ds; --remeasure measures them again)"
        )
    lines.append(f"micro-batch {plan.micro_batch}, global batch {plan.global_batch} (x{hw.world} ranks)")
    for title, rows in (("", plan.rows), (" (gradient checkpointing on)", plan.checkpointing_rows)):
        if not rows:
            continue
        lines += [
            "",
            f"strategies{title}:",
            f"{'':<14} fits  peak/GPU     host/node    largest mb          accumulation",
        ]
        for row in rows:
            host = gib(row.host_bytes_per_node) if row.host_bytes_per_node else "-"
            accumulation = f"{row.accumulation} (mb {row.micro_batch})" if row.largest_micro_batch else "-"
            largest = str(row.largest_micro_batch)
            if row.largest_micro_batch and row.largest_limited_by != "memory":
                largest += f" ({row.largest_limited_by})"
            lines.append(
                f"{row.strategy:<14} {'yes' if row.fits else 'no':<5} {gib(row.device_bytes):<12} "
                f"{host:<12} {largest:<19} {accumulation}" + (f"  - {row.note}" if row.note else "")
            )
    lines.append("")
    if plan.recommendation is None:
        lines.append(
            "nothing fits, even at micro-batch 1 with gradient checkpointing: add GPUs or nodes (ZeRO-3 "
            "shards with their number), or an offload strategy with more host memory"
        )
    else:
        rec = plan.recommendation
        lines += [f"recommended: {rec.strategy} - {rec.why}", f"  {rec.command}"]
    return "\n".join(lines)
