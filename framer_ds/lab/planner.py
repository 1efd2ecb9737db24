"""`framer-ds plan`: which strategy fits a config on given hardware, at which micro-batch, and the launch
command - answered before the job queues.

Inputs, all without weights: the parameter census (lab/census.py), the measured activation line
(lab/activations.py, with gradient checkpointing as configured and switched on) and the DeepSpeed JSON
of each strategy with its "auto" buffers resolved as the engine would (engine.zero_buffers). The memory
model (lab/memory_model.py) adds them up per strategy. A GPU's memory is not all the tensors': the plan
keeps an allowance for the CUDA context, kernels' workspaces and the caching allocator's fragmentation
(lab/hardware.py), and says how much.

The recommendation is the fastest strategy that fits, in the order a step usually costs: DDP, ZeRO-2,
ZeRO++ (only across nodes, where its quantized, node-local gathers pay), ZeRO-3, then the offloads. At
the configured micro-batch first; else at the largest micro-batch that fits, with more accumulation
for the same global batch; else the same with gradient checkpointing switched on.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from framer_ds.engine.zero_buffers import resolve_auto
from framer_ds.lab.activations import ActivationProbe, probe_activations
from framer_ds.lab.census import helper_modules, meta_model, task_census
from framer_ds.lab.hardware import ALLOWANCE_FIXED, ALLOWANCE_SHARE, GiB, Hardware
from framer_ds.lab.memory_model import STRATEGIES, MemoryEstimate, ParameterCensus, estimate
from framer_ds.lab.micro_batch import MAX_MICRO_BATCH, largest_fitting, micro_batch_limit, split_batch
from framer_ds.lab.stand_ins import stand_in_overrides
from framer_ds.tasks.planning import planning_hooks
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

SPEED_ORDER = ("ddp", "zero2", "zeropp", "zero3", "fsdp2", "zero2_offload", "zero3_offload")
SINGLE_NODE_SIZES = (1, 2, 4, 8)


def parse_bytes(text: str) -> int:
    """'40GB', '80GiB', '512G', '24000MB' -> bytes. GB and GiB both mean 2^30 (as nvidia-smi's MiB)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 40GB, 80GiB or 512G")
    power = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024**power)


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


@dataclass
class Recommendation:
    strategy: str
    micro_batch: int
    accumulation: int
    gradient_checkpointing: bool
    command: str
    why: str


@dataclass
class Plan:
    config: str
    overrides: list[str]
    hardware: Hardware
    census: ParameterCensus
    activations: dict[str, ActivationProbe]
    """"configured" and, when the config has it off, "checkpointing"."""
    micro_batch: int
    global_batch: int
    rows: list[StrategyRow]
    checkpointing_rows: list[StrategyRow]
    recommendation: Recommendation | None
    assumptions: list[str] = field(default_factory=list)
    """What the plan stood in for because it is not on disk (shipped architectures, data sizes)."""

    def as_dict(self) -> dict[str, Any]:
        census = asdict(self.census)
        census["auto_buffers"] = dict(self.census.auto_buffers)
        return {
            "config": self.config,
            "overrides": self.overrides,
            "assumptions": self.assumptions,
            "hardware": {
                **asdict(self.hardware),
                "world": self.hardware.world,
                "allowance_bytes": self.hardware.allowance,
                "usable_bytes": self.hardware.usable,
            },
            "census": census,
            "activations": {name: probe.as_dict() for name, probe in self.activations.items()},
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "strategies": [asdict(row) for row in self.rows],
            "with_gradient_checkpointing": [asdict(row) for row in self.checkpointing_rows],
            "recommendation": asdict(self.recommendation) if self.recommendation else None,
        }


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


def launch_command(
    strategy: str, hardware: Hardware, config_path: str, overrides: Sequence[str], deepspeed_dir: Path
) -> str:
    """The `accelerate launch` line for the shipped configs (one line per node when multi-node)."""
    tail = ["-m", "framer_ds", "train", config_path, *overrides]
    if strategy == "fsdp2":
        return shlex.join(["accelerate", "launch", *_fsdp2_launch(hardware), *tail])
    if hardware.nodes > 1:
        head = ["--config_file", "configs/accelerate_multinode.yaml"]
        head += ["--num_machines", str(hardware.nodes), "--num_processes", str(hardware.world)]
        head += ["--machine_rank", "RANK", "--main_process_ip", "HEAD_NODE", "--main_process_port", "29500"]
        if strategy == "ddp":
            head = ["--multi_gpu", *head[2:]]
    elif strategy == "ddp":
        head = ["--multi_gpu"] if hardware.world > 1 else []
        head += ["--num_processes", str(hardware.world)]
    elif hardware.world == 1:  # accelerate_1gpu.yaml runs without DeepSpeed
        head = ["--config_file", "configs/accelerate_1gpu_offload.yaml"]
    else:
        size = hardware.world if hardware.world in SINGLE_NODE_SIZES else 8
        head = ["--config_file", f"configs/accelerate_{size}gpu.yaml"]
        if size != hardware.world:
            head += ["--num_processes", str(hardware.world)]
    if strategy != "ddp":
        head += ["--deepspeed_config_file", str(deepspeed_dir / f"{strategy}.json")]
    return shlex.join(["accelerate", "launch", *head, *tail])


def _fsdp2_launch(hardware: Hardware) -> list[str]:
    """The shipped FSDP2 accelerate YAML for this hardware, with the counts it does not already say."""
    if hardware.nodes > 1:
        return [
            "--config_file", "configs/accelerate_fsdp2_multinode.yaml",
            "--num_machines", str(hardware.nodes), "--num_processes", str(hardware.world),
            "--machine_rank", "RANK", "--main_process_ip", "HEAD_NODE", "--main_process_port", "29500",
        ]  # fmt: skip
    size = 4 if hardware.world <= 4 else 8
    head = ["--config_file", f"configs/accelerate_fsdp2_{size}gpu.yaml"]
    return head + (["--num_processes", str(hardware.world)] if size != hardware.world else [])


def _recommend(
    rows: list[StrategyRow], hardware: Hardware, configured_micro_batch: int
) -> tuple[StrategyRow, str] | None:
    ranked = [row for s in SPEED_ORDER for row in rows if row.strategy == s]
    ranked = [row for row in ranked if row.strategy != "zeropp" or hardware.nodes > 1]
    for row in ranked:
        if row.fits:
            return row, f"the fastest strategy that fits at micro-batch {configured_micro_batch}"
    for row in ranked:
        if row.largest_micro_batch >= 1:
            why = (
                f"nothing fits at micro-batch {configured_micro_batch}; the fastest that fits at a smaller "
                f"one ({row.micro_batch}), with {row.accumulation} accumulation steps for the global batch"
            )
            return row, why
    return None


def make_plan(
    config_path: Path | str,
    overrides: Sequence[str],
    hardware: Hardware,
    deepspeed_dir: Path = Path("configs/deepspeed"),
    strategies: Sequence[str] = STRATEGIES,
    global_batch: int | None = None,
) -> Plan:
    """Census, activation probes and every strategy's row; see the module docstring."""
    config = load_run_config(config_path, overrides)
    stand_ins, assumptions = stand_in_overrides(config)
    if stand_ins:
        config = load_run_config(config_path, [*overrides, *stand_ins])
    task = get_task_class(config.task)(config)
    model = meta_model(task)  # one build for both: the census counts it before the probe fakes it
    helpers = helper_modules(task)
    census = task_census(task, model, helpers)
    train = config.train
    probes = {"configured": probe_activations(task, model=model, helpers=helpers.in_evaluation)}
    if not train.gradient_checkpointing:
        switched = load_run_config(config_path, [*overrides, *stand_ins, "train.gradient_checkpointing=true"])
        probe = probe_activations(get_task_class(switched.task)(switched), with_eval=False)
        probes["checkpointing"] = replace(probe, eval_transient=probes["configured"].eval_transient)
    micro_batch = train.micro_batch_size
    target = global_batch or micro_batch * train.gradient_accumulation_steps * hardware.world

    limit = micro_batch_limit(planning_hooks(task).train_example_count(), hardware.world)
    zeros: dict[str, dict | FileNotFoundError] = {}  # each JSON read once, for both probes
    for strategy in strategies:
        try:
            zeros[strategy] = resolved_zero(strategy, census, deepspeed_dir, hardware)
        except FileNotFoundError as exc:
            zeros[strategy] = exc

    def rows_for(probe: ActivationProbe) -> list[StrategyRow]:
        mp = train.mixed_precision
        return [
            StrategyRow(strategy, False, 0, 0, 0, "memory", micro_batch, 0, 0, note=str(zero))
            if isinstance(zero, FileNotFoundError)
            else strategy_row(strategy, census, probe, hardware, mp, zero, micro_batch, target, limit)
            for strategy, zero in zeros.items()
        ]

    rows = rows_for(probes["configured"])
    checkpointing_rows = rows_for(probes["checkpointing"]) if "checkpointing" in probes else []
    config_str = str(config_path)
    chosen, switched_on = _recommend(rows, hardware, micro_batch), False
    if chosen is None and checkpointing_rows:
        chosen, switched_on = _recommend(checkpointing_rows, hardware, micro_batch), True
    recommendation = None
    if chosen is not None:
        row, why = chosen
        extra = list(overrides)
        if (row.micro_batch, row.accumulation) != (micro_batch, train.gradient_accumulation_steps):
            extra += [
                f"train.micro_batch_size={row.micro_batch}",
                f"train.gradient_accumulation_steps={row.accumulation}",
            ]
        if switched_on:
            extra.append("train.gradient_checkpointing=true")
            why += ", with gradient checkpointing switched on"
        command = launch_command(row.strategy, hardware, config_str, extra, deepspeed_dir)
        checkpointing = bool(train.gradient_checkpointing or switched_on)
        recommendation = Recommendation(
            row.strategy, row.micro_batch, row.accumulation, checkpointing, command, why
        )
    return Plan(
        config=config_str,
        overrides=list(overrides),
        hardware=hardware,
        census=census,
        activations=probes,
        micro_batch=micro_batch,
        global_batch=target,
        rows=rows,
        checkpointing_rows=checkpointing_rows,
        recommendation=recommendation,
        assumptions=[*assumptions, *planning_hooks(task).plan_assumptions()],
    )


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
