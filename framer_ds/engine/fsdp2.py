"""PyTorch FSDP2 (`fully_shard`, DTensor) as the third strategy, on GPUs and on CPU processes alike.

Facts this encodes (docs/distributed.md, "FSDP2"):
- `accelerate launch` with `distributed_type: FSDP` sets ACCELERATE_USE_FSDP and FSDP_* variables; the
  plugin is built from them. accelerate (1.15) switches FSDP on only for GPU-like distributed types: on
  CPU processes (MULTI_CPU over gloo) the config is silently ignored and each rank trains an unsharded
  copy. torch's `fully_shard` itself works on CPU over gloo, so without a GPU the engine selects FSDP in
  the accelerator state itself, after the process group exists and before anything is prepared: the run
  then takes accelerate's own FSDP2 path (`_prepare_fsdp2`, DTensor clipping, `set_requires_gradient_
  sync` for accumulation, sharded save/load) exactly as on GPUs.
- Only FSDP2 is supported (`fsdp_version: 2`): FSDP1 is on its way out of PyTorch, and one path is what
  the tests cover.
- The auto-wrap class is the task's (`Task.fsdp_block_classes`), not a name in the accelerate YAML, so
  one accelerate file serves every task; an explicit `fsdp_transformer_layer_cls_to_wrap` is kept.
- train.mixed_precision is the one source of truth: it becomes the plugin's MixedPrecisionPolicy.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin


def fsdp_requested() -> bool:
    """True when launched by `accelerate launch` with an FSDP config (any version)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def fsdp_plugin_from_env() -> FullyShardedDataParallelPlugin | None:
    """The plugin the launch asked for, or None. FSDP1 and a single process are refused before this,
    with the other launch problems (`config.launch_check.check_runtime_environment`)."""
    return FullyShardedDataParallelPlugin() if fsdp_requested() else None


def select_fsdp2_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """Turn a MULTI_CPU accelerator state into FSDP2 (what accelerate does itself on GPUs).

    Must run right after the Accelerator is built and before `prepare`: accelerate reads
    `distributed_type` and `fsdp_plugin` from the state at prepare, backward, clipping, no_sync and
    save/load time."""
    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(
            f"internal: FSDP2 on CPU expects a MULTI_CPU state, got {state.distributed_type}; "
            "launch with the accelerate config's num_processes >= 2 (configs/accelerate_fsdp2_cpu_2proc.yaml)"
        )
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP


def uses_fsdp2(accelerator: Accelerator) -> bool:
    """Parameters are DTensor shards: saving gathers them, and checkpoints are sharded per rank."""
    return accelerator.state.distributed_type == DistributedType.FSDP and accelerator.is_fsdp2


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of `tensor`: an FSDP2 parameter (or its Adam state) is a DTensor whose
    local shard is the part to check or count; torch ops mixing DTensors and plain tensors raise."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of an FSDP2 parameter: a DTensor shard is all-gathered (a collective: every rank, the
    same parameters in the same order); a plain tensor already is whole, as the parameters of a unit
    left unsharded by a forward without backward are (the root unit after evaluation or sampling)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def set_wrap_classes(accelerator: Accelerator, class_names: list[str]) -> None:
    """Auto-wrap the model's repeated blocks (one FSDP unit each, so only one block's full parameters
    exist at a time) by the class names the task gives. Before `prepare`; a name the YAML set wins."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)  # unset unless FSDP runs
    if plugin is None or not class_names:
        return
    if plugin.transformer_cls_names_to_wrap is None:
        plugin.transformer_cls_names_to_wrap = list(class_names)


def describe_fsdp2(accelerator: Accelerator, device: str) -> str:
    """The run summary's strategy line under FSDP2."""
    plugin = accelerator.state.fsdp_plugin
    parts = [f"FSDP2 on {accelerator.num_processes} {device} process(es)"]
    names = plugin.transformer_cls_names_to_wrap
    if names:
        parts.append(f"wrapping {', '.join(names)}")
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import DTensor

    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        parts.append("parameter offload (cpu)")
    # What was really cut: a LoRA's frozen base must be sharded too (that is where its memory is).
    params = [p for model in accelerator._models for p in model.parameters()]
    if params:
        sharded = [p for p in params if isinstance(p, DTensor)]
        frozen = sum(not p.requires_grad for p in sharded)
        parts.append(f"sharded: {len(sharded)} of {len(params)} parameter tensors ({frozen} frozen)")
    return " + ".join(parts)
