"""Assemble what one training run steps: the task's model and data (its phases, in the order
`tasks.assemble` names), the optimizer, the LR schedule and the loaders, all through
`accelerator.prepare`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.schema import RunConfigBase, TrainConfig
from framer_ds.engine.base_precision import quantize_frozen_base
from framer_ds.engine.block_checkpoint import checkpoint_repeated_blocks
from framer_ds.engine.compile import compile_repeated_blocks
from framer_ds.engine.fsdp2 import set_wrap_classes
from framer_ds.engine.optim8bit import adamw_8bit
from framer_ds.engine.precision import store_frozen_in_compute_dtype
from framer_ds.engine.rng import seed_training_draws
from framer_ds.engine.zero_buffers import ParameterSizes, ZeroBuffers, size_zero_buffers
from framer_ds.tasks.assemble import assemble
from framer_ds.tasks.base import Task
from framer_ds.train.lr_schedule import build_lr_scheduler
from framer_ds.train.schedule import StepPlan, plan_steps


@dataclass
class TrainingRun:
    """Everything `prepare` returned, bundled so the step and the step actions take one argument."""

    accelerator: Accelerator
    task: Task
    config: RunConfigBase
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader
    eval_loader: DataLoader | None
    plan: StepPlan
    train_examples: int
    eval_examples: int
    trainable_parameters: int
    total_parameters: int
    zero_buffers: ZeroBuffers | None = None
    """DeepSpeed's buffer fields as the engine runs them (None without DeepSpeed)."""
    compiled: str | None = None
    """What `train.compile` compiled (for the run summary); None when it is off."""
    quantized: str | None = None
    """What `model.base_precision` quantized (for the run summary); None at full precision."""


def fused_adam_supported(device: torch.device, parameters: list[torch.nn.Parameter]) -> bool:
    """Whether AdamW can run fused here: one kernel per step and no temporaries.

    Why: the unfused CPU path (and foreach on a GPU) allocates temporaries the size of each parameter
    it updates. Under ZeRO that parameter is one flat partition of the whole model, so every step
    allocated ~2 x (trainable / N) x 4 bytes on top of the optimizer state (+327 MiB per rank for a
    ViT-B on 2 ranks), which put ZeRO-2/3 above DDP. DeepSpeed steps our torch AdamW on that flat
    partition (with optimizer offload accelerate swaps in DeepSpeedCPUAdam, fused already)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    floating = all(p.is_floating_point() for p in parameters)
    return floating and device.type in _get_fused_kernels_supported_devices()


def decay_groups(groups: list[dict], weight_decay: float) -> list[dict]:
    """Each param group split in two: weight decay on matrices (linear, embedding and convolution
    weights) only, none on vectors (biases, RMSNorm / LayerNorm / GroupNorm weights).

    Why: decaying a norm's gain pulls it towards 0, i.e. shrinks that layer's output, which no loss term
    asks for; transformers' Trainer exempts norms and biases the same way (its names-based rule picks the
    same parameters for the models we train). The exempt group carries `no_decay: True`, so a resume that
    applies a new `weight_decay` (engine/resume/running_config.py) keeps it at 0. A split group keeps its
    own learning rate and `lr_scale` (`param_groups`)."""
    split = []
    for group in groups:
        matrices = [p for p in group["params"] if p.ndim >= 2]
        vectors = [p for p in group["params"] if p.ndim < 2]
        if matrices:
            split.append({**group, "params": matrices, "weight_decay": weight_decay})
        if vectors:
            split.append({**group, "params": vectors, "weight_decay": 0.0, "no_decay": True})
    return split


def build_optimizer(
    model: torch.nn.Module,
    train_cfg: TrainConfig,
    device: torch.device,
    task_groups: list[dict] | None = None,
) -> torch.optim.Optimizer:
    """AdamW (train.optimizer.name: torch's, or torchao's 8-bit one) over the trainable parameters: the
    task's groups (`Task.optimizer_groups`, or one), each split by `decay_groups`."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = train_cfg.optimizer
    groups = decay_groups(param_groups(task_groups, trainable, opt.learning_rate), opt.weight_decay)
    hyper = {"lr": opt.learning_rate, "betas": (opt.beta1, opt.beta2), "eps": opt.epsilon}
    if opt.name == "adamw_8bit":
        return adamw_8bit(groups, **hyper)
    return torch.optim.AdamW(groups, **hyper, fused=fused_adam_supported(device, trainable))


def training_loaders(
    task: Task, train_cfg: TrainConfig, train_set: Dataset, eval_set: Dataset | None
) -> tuple[DataLoader, DataLoader | None]:
    """The training loader (the task's sampler, else shuffled; the last short batch dropped) and the
    eval loader, before `prepare`. The training loader shuffles with its own generator, seeded from
    train.seed: PyTorch otherwise draws each epoch iterator's base seed from the global RNG, which on
    resume would shift the dropout/augmentation stream restored by load_state."""
    loader_kwargs = {
        "batch_size": train_cfg.micro_batch_size,
        "collate_fn": task.collate_fn(),
        "num_workers": train_cfg.num_workers,
        "pin_memory": torch.cuda.is_available(),
        "persistent_workers": train_cfg.num_workers > 0,
    }
    sampler = task.train_sampler(train_set)
    order = {"sampler": sampler} if sampler is not None else {"shuffle": True}
    shuffle_generator = torch.Generator().manual_seed(train_cfg.seed)
    train_loader = DataLoader(
        train_set, drop_last=True, generator=shuffle_generator, **order, **loader_kwargs
    )
    eval_loader = DataLoader(eval_set, shuffle=False, **loader_kwargs) if eval_set is not None else None
    return train_loader, eval_loader


def _check_best_metric(task: Task, train_cfg: TrainConfig, eval_set: Dataset | None) -> None:
    """A best checkpoint needs evaluations: refused before the slow phases, not at the first eval."""
    if eval_set is None and train_cfg.eval.best_metric is not None:
        raise ConfigError(
            [
                ConfigProblem(
                    "train.eval.best_metric",
                    f"is {train_cfg.eval.best_metric!r} but task {task.name!r} built no eval set, so there "
                    "is no best evaluation to keep: give the task validation data (see its data options) or "
                    "set train.eval.best_metric=null",
                )
            ],
            "the run's config",
        )


def param_groups(
    task_groups: list[dict] | None, trainable: list[torch.nn.Parameter], learning_rate: float
) -> list[dict]:
    """The task's param groups (`Task.optimizer_groups`) or one group; each carries `lr_scale`, its
    learning rate over train.optimizer.learning_rate, which resume re-applies (`apply_running_config`)
    so a group's rate follows the config that runs, like the main one."""
    groups = task_groups or [{"params": trainable}]
    grouped = [p for group in groups for p in group["params"]]
    if len(grouped) != len(trainable) or {id(p) for p in grouped} != {id(p) for p in trainable}:
        raise RuntimeError("internal: the task's optimizer groups do not hold every trainable parameter once")
    return [{**group, "lr_scale": group.get("lr", learning_rate) / learning_rate} for group in groups]


def build_training_run(accelerator: Accelerator, task: Task, config: RunConfigBase) -> TrainingRun:
    train_cfg = config.train
    parts = assemble(task, accelerator, lambda _, eval_set: _check_best_metric(task, train_cfg, eval_set))
    train_set, eval_set, model = parts.train_set, parts.eval_set, parts.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise RuntimeError(f"task {task.name!r} built a model with no trainable parameters")
    sizes = ParameterSizes.of(model)
    plugin = accelerator.state.deepspeed_plugin
    # Before prepare: the DeepSpeed engine reads its buffer sizes when it is built.
    zero_buffers = None
    if plugin is not None:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))  # set by torchrun
        zero_buffers = size_zero_buffers(plugin.deepspeed_config, sizes, train_cfg.mixed_precision, per_node)
    blocks = task.fsdp_block_classes(model)
    set_wrap_classes(accelerator, blocks)  # before prepare shards the model
    store_frozen_in_compute_dtype(accelerator, model)  # as DeepSpeed holds them (before quantizing)
    base_precision = config.model.base_precision
    quantized = quantize_frozen_base(model, base_precision) if base_precision != "full" else None
    if train_cfg.checkpoint_blocks:
        checkpoint_repeated_blocks(model, blocks)  # before compile: the compiled call runs this forward
    compiled = compile_repeated_blocks(model, blocks) if train_cfg.compile else None
    examples = (len(train_set), len(eval_set) if eval_set is not None else 0)
    optimizer = build_optimizer(model, train_cfg, accelerator.device, task.optimizer_groups(model))
    train_loader, eval_loader = training_loaders(task, train_cfg, train_set, eval_set)
    # the sampler's length, not the set's: a task's sampler may repeat items (video_lora's buckets fill
    # each bucket's last block with its own clips), and the loader yields what the sampler does
    plan = plan_steps(len(train_loader.sampler), train_cfg, accelerator.num_processes)
    scheduler = build_lr_scheduler(train_cfg.lr_schedule.name, optimizer, plan.warmup_steps, plan.total_steps)
    if eval_loader is not None:
        model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, eval_loader, scheduler
        )
    else:
        model, optimizer, train_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, scheduler
        )
    # The model was built from train.seed on every rank (assemble); the draws of training are each rank's
    # own from here on (a checkpoint's random_states_<rank>.pkl replaces them on resume).
    seed_training_draws(train_cfg.seed, accelerator.process_index)
    if len(train_loader) != plan.batches_per_epoch:
        raise RuntimeError(
            f"internal: planned {plan.batches_per_epoch} batches per epoch, the prepared loader has "
            f"{len(train_loader)}; please report this with your launch command"
        )
    return TrainingRun(
        accelerator,
        task,
        config,
        model,
        optimizer,
        scheduler,
        train_loader,
        eval_loader,
        plan,
        *examples,
        sizes.trainable,
        sizes.total,
        zero_buffers,
        compiled,
        quantized,
    )
