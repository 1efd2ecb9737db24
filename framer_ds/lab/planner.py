"""`framer-ds plan`: which strategy fits a config on given hardware, at which micro-batch, and the launch
command - answered before the job queues.

Inputs, all without weights: the parameter census (lab/census.py), the measured activation line
(lab/activations.py, with gradient checkpointing as configured and switched on) - both measured once per
config and read from the cache after (lab/plan_inputs.py) - and the DeepSpeed JSON of each strategy with
its "auto" buffers resolved as the engine would (engine.zero_buffers). The memory model
(lab/memory_model.py) adds them up per strategy into one row each (lab/plan_rows.py); the text is
lab/plan_text.py's, the launch line lab/launch_commands.py's. A GPU's memory is not all the tensors': the plan
keeps an allowance for the CUDA context, kernels' workspaces and the caching allocator's fragmentation
(lab/hardware.py), and says how much.

The recommendation is the fastest strategy that fits, in the order a step usually costs: DDP, ZeRO-2,
ZeRO++ (only across nodes, where its quantized, node-local gathers pay), ZeRO-3, then the offloads. At
the configured micro-batch first; else at the largest micro-batch that fits, with more accumulation
for the same global batch; else the same with gradient checkpointing switched on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from framer_ds.lab.activation_probe import ActivationProbe
from framer_ds.lab.hardware import Hardware
from framer_ds.lab.launch_commands import launch_command
from framer_ds.lab.memory_model import STRATEGIES, ParameterCensus
from framer_ds.lab.micro_batch import micro_batch_limit
from framer_ds.lab.plan_inputs import CacheEntry, cached_inputs, measure_inputs
from framer_ds.lab.plan_rows import StrategyRow, resolved_zero, strategy_row
from framer_ds.lab.stand_ins import stand_in_overrides
from framer_ds.tasks.planning import planning_hooks
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

SPEED_ORDER = ("ddp", "zero2", "zeropp", "zero3", "fsdp2", "zero2_offload", "zero3_offload")


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
    inputs_cache: CacheEntry | None = None
    """The cache entry the census and probes were read from or written to (lab/plan_inputs.py)."""

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
            "inputs_cache": (
                {"path": str(cache.path), "hit": cache.hit} if (cache := self.inputs_cache) else None
            ),
        }


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
    remeasure: bool = False,
) -> Plan:
    """Census, activation probes (from the cache when measured before: lab/plan_inputs.py; `remeasure`
    measures them again) and every strategy's row; see the module docstring."""
    config = load_run_config(config_path, overrides)
    stand_ins, assumptions = stand_in_overrides(config)
    if stand_ins:
        config = load_run_config(config_path, [*overrides, *stand_ins])
    task = get_task_class(config.task)(config)
    hooks = planning_hooks(task)
    train = config.train

    def checkpointing_task():
        switched = load_run_config(config_path, [*overrides, *stand_ins, "train.gradient_checkpointing=true"])
        return get_task_class(switched.task)(switched)

    switch = None if train.gradient_checkpointing else checkpointing_task
    inputs, cache = cached_inputs(config, lambda: measure_inputs(task, switch), remeasure=remeasure)
    census, probes = inputs.census, inputs.probes
    micro_batch = train.micro_batch_size
    target = global_batch or micro_batch * train.gradient_accumulation_steps * hardware.world

    # after the inputs: a measurement prepared the built-in assets it counts (census.meta_model); a plan
    # read from the cache prepares nothing (a tiny base's builder imports diffusers: seconds of CPU)
    limit = micro_batch_limit(hooks.train_example_count(), hardware.world)
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
        assumptions=[*assumptions, *inputs.assumptions],
        inputs_cache=cache,
    )
