"""Build the one Accelerator from the launch environment, with the CPU fallbacks DeepSpeed needs.

Facts this encodes (docs/architecture.md, "Accelerate + DeepSpeed"):
- `accelerate launch` with a DeepSpeed config sets ACCELERATE_USE_DEEPSPEED; the plugin is built from
  the environment. Without a GPU, DeepSpeed runs on its CPU accelerator but accelerate reports one
  process on every rank unless the process group is created with gloo explicitly.
- DDP without a GPU needs `cpu=True` (MULTI_CPU over gloo). `cpu=True` with DeepSpeed would silently
  drop DeepSpeed, so it is only set when DeepSpeed is not requested.
- DDP keeps gradients as views into its all-reduce buckets (`gradient_as_bucket_view`): otherwise every
  gradient exists twice, once in `.grad` and once in the bucket (+4 bytes per trainable parameter in
  fp32). `static_graph` stays off: it saves no memory, and it forbids a graph that changes between
  iterations, which the Task protocol does not ask tasks to promise.
- FSDP2 on CPU: accelerate ignores an FSDP config without a GPU; `engine.fsdp2` selects it itself.
- The training YAML is the single source of truth: precision and accumulation are passed explicitly,
  and DeepSpeed's "auto" gradient clipping is filled from `train.optimizer.max_grad_norm` (accelerate would
  otherwise fill 1.0).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import torch
from accelerate import (
    Accelerator,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
)
from accelerate.utils import ProjectConfiguration

from framer_ds.compat import require
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.deepspeed_ops import announce_op_builds
from framer_ds.engine.deepspeed_unused import skip_unused_deepspeed_parts
from framer_ds.engine.fsdp2 import describe_fsdp2, fsdp_plugin_from_env, select_fsdp2_on_cpu, uses_fsdp2


def deepspeed_requested() -> bool:
    """True when launched by `accelerate launch` with a DeepSpeed config."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def tracker_names(config: RunConfigBase) -> list[str]:
    """The configured trackers, each checked to import (a missing wandb or tensorboard is named here,
    with how to install it, not deep inside accelerate)."""
    names = []
    if config.log.wandb is not None:
        require("wandb", "W&B logging (log.wandb)")
        names.append("wandb")
    if config.log.tensorboard:
        require("tensorboard", "TensorBoard logging (log.tensorboard)")
        names.append("tensorboard")
    return names


def build_accelerator(config: RunConfigBase, collective_timeout_s: int = 1800) -> Accelerator:
    """The Accelerator for this process; call once per run, before building models."""
    has_gpu = torch.cuda.is_available()
    use_deepspeed = deepspeed_requested()
    if use_deepspeed:
        announce_op_builds()
        skip_unused_deepspeed_parts()
    fsdp_plugin = fsdp_plugin_from_env()
    handlers: list = [DistributedDataParallelKwargs(gradient_as_bucket_view=True)]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # A dead rank must take the job down within the timeout rather than hang a collective forever.
        group_kwargs: dict = {"timeout": timedelta(seconds=collective_timeout_s)}
        if not has_gpu:
            group_kwargs["backend"] = "gloo"
        handlers.append(InitProcessGroupKwargs(**group_kwargs))
    accelerator = Accelerator(
        cpu=not has_gpu and not use_deepspeed,
        mixed_precision=config.train.mixed_precision,
        gradient_accumulation_steps=config.train.gradient_accumulation_steps,
        # The scheduler is stepped once per optimizer step by the loop (and by the DeepSpeed engine),
        # never num_processes times, so DDP and ZeRO follow the same LR curve.
        step_scheduler_with_optimizer=False,
        log_with=tracker_names(config) or None,
        project_config=ProjectConfiguration(
            project_dir=str(config.output_dir), logging_dir=str(config.output_dir / "tensorboard")
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.train.seed),
        kwargs_handlers=handlers,
        fsdp_plugin=fsdp_plugin,
    )
    if fsdp_plugin is not None and not has_gpu and accelerator.num_processes > 1:
        select_fsdp2_on_cpu(accelerator, fsdp_plugin)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.deepspeed_config.get("gradient_clipping", "auto") == "auto":
        plugin.deepspeed_config["gradient_clipping"] = config.train.optimizer.max_grad_norm
    return accelerator


@contextlib.contextmanager
def frozen_model_init(accelerator: Accelerator) -> Iterator[None]:
    """Build frozen helpers (VAE, image encoder) as whole modules, never as ZeRO-3 shards.

    Under ZeRO-3 accelerate registers its DeepSpeed config with transformers, whose `from_pretrained`
    then builds every model inside `deepspeed.zero.Init` and partitions it, even with
    zero3_init_flag false and after `prepare`; a module that never goes through `prepare` is then left
    with empty weights. accelerate's `zero3_init_context_manager(enable=False)` does not undo that
    registration when the flag is already false, so it is lifted here too for the duration.
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        yield
        return
    from transformers.integrations import deepspeed as hf_deepspeed

    registered = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = registered() if registered is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        with plugin.zero3_init_context_manager(enable=False):
            yield
    finally:
        if config is not None:
            hf_deepspeed.set_hf_deepspeed_config(config)


def describe_strategy(accelerator: Accelerator) -> str:
    """What the launch really gave, in words: the run summary shows it, because a launch that quietly
    runs something else (`accelerate launch --cpu --num_processes 2` starts ONE process) is otherwise
    only noticed in the throughput."""
    device = "GPU" if accelerator.device.type == "cuda" else accelerator.device.type.upper()
    processes = accelerator.num_processes
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        zero = plugin.deepspeed_config.get("zero_optimization", {})
        offload = [
            f"{what} offload ({device_})"
            for what, key in (("optimizer", "offload_optimizer"), ("parameter", "offload_param"))
            if (device_ := (zero.get(key) or {}).get("device", "none")) not in (None, "none")
        ]
        return " + ".join(
            [f"DeepSpeed ZeRO-{plugin.zero_stage} on {processes} {device} process(es)", *offload]
        )
    if uses_fsdp2(accelerator):
        return describe_fsdp2(accelerator, device)
    if processes > 1:
        return f"DDP on {processes} {device} processes"
    note = ""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and "WORLD_SIZE" not in os.environ:
        note = " (`accelerate launch --cpu` starts one; for N CPU processes: --multi_gpu --num_processes N)"
    return f"single {device} process{note}"


def uses_deepspeed(accelerator: Accelerator) -> bool:
    return accelerator.state.deepspeed_plugin is not None


def uses_zero3(accelerator: Accelerator) -> bool:
    """Parameters are sharded: saving must gather them, and every forward (generation too) is a
    collective all ranks must join."""
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and plugin.zero_stage == 3


@contextlib.contextmanager
def accumulation_step(accelerator: Accelerator, model: torch.nn.Module, boundary: bool) -> Iterator[None]:
    """One micro-batch of an accumulation window whose end the caller decides (`boundary`).

    accelerate's `accumulate()` decides the boundary itself, from a micro-batch counter and the
    DataLoader's end-of-epoch flag; a loop that looks at a whole window before its first backward (to
    normalise a summed loss by the window's item count) has already fetched the epoch's last batch, so
    that flag would end every window early. The rest is what `accumulate()` does: DDP skips the
    gradient all-reduce inside a window, the accelerated optimizer steps only at the boundary, and the
    DeepSpeed engine takes its accumulation boundary from the same flag (`set_gradient_accumulation_
    boundary` in accelerate's engine wrapper).
    """
    accelerator.gradient_state._set_sync_gradients(boundary)
    with contextlib.nullcontext() if boundary else accelerator.no_sync(model):
        yield


def end_accelerator(accelerator: Accelerator, *, failed: bool) -> None:
    """Finish every tracker and destroy the process group: once per run, after success or failure.

    Why: a process group left to the interpreter's exit is torn down while gloo's threads still run,
    and a rank can abort with `terminate called without an active exception` (exit -6) after a run
    that succeeded. accelerate's `end_training` does both steps, but only when called, and the loop
    used to call it only when trackers were configured. A failed run marks its W&B run failed instead
    of finished, so dashboards do not show a crash as a clean end.
    """
    try:
        for tracker in accelerator.trackers:
            if failed and tracker.name == "wandb":
                tracker.tracker.finish(exit_code=1)
            else:
                tracker.finish()
        accelerator.trackers = []
    finally:
        accelerator.state.destroy_process_group()


def reset_accelerate_state() -> None:
    """Clear accelerate's process-wide state (AcceleratorState, GradientState: singletons that outlive an
    Accelerator), so the next Accelerator built in this process (another run, `framer-ds eval`) starts
    from its own config rather than the last one's. Needed wherever one process runs several commands:
    `framer-ds smoke`'s phases, and the tests."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
