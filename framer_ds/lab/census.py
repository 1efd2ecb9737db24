"""Count what a config trains, exactly, without reading a weight file: the planner's first input.

Why through the task: the count must be the model training builds - LoRA adapters, a widened input
conv, resized embeddings - and only the task knows those steps. `task.build_model()` runs inside
`engine.pretrained.empty_weights()`, so checkpoints contribute their config.json and nothing else,
and every parameter is a meta tensor (no memory, any size of model on a laptop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from framer_ds.config.zero_fields import element_bytes
from framer_ds.engine.block_checkpoint import checkpoint_repeated_blocks
from framer_ds.engine.optim8bit import state_bytes
from framer_ds.engine.precision import dtype_of
from framer_ds.engine.pretrained import empty_weights
from framer_ds.engine.zero_buffers import ParameterSizes, auto_values, persistence_threshold
from framer_ds.lab.memory_model import ParameterCensus
from framer_ds.tasks.base import Task
from framer_ds.tasks.planning import planning_hooks
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config


def census_of(
    model: torch.nn.Module,
    helpers: Sequence[torch.nn.Module] = (),
    mixed_precision: str = "no",
    base_precision: str = "full",
    optimizer: str = "adamw",
) -> ParameterCensus:
    """The element counts the memory model needs; helpers are counted in the training compute dtype.
    `base_precision` int8/fp8 counts the frozen Linear weights as engine.base_precision stores them;
    `optimizer` adamw_8bit counts the moments as torchao's AdamW8bit stores them."""
    sizes = ParameterSizes.of(model)
    parameters = list(model.parameters())  # tied weights once
    trainable = [p.numel() for p in parameters if p.requires_grad]
    frozen = [p for p in parameters if not p.requires_grad]
    threshold = persistence_threshold(sizes.numels, sizes.total)
    helper_elements = sum(p.numel() for helper in helpers for p in helper.parameters())
    quantized = [m.weight for m in model.modules() if _stored_quantized(m, base_precision)]
    quantized_elements = sum(w.numel() for w in quantized)
    return ParameterCensus(
        trainable=sizes.trainable,
        frozen=sizes.total - sizes.trainable - quantized_elements,
        largest_trainable=max(trainable, default=0),
        persistent_small=sum(n for n in sizes.numels if n <= threshold) if threshold else 0,
        helper_bytes=helper_elements * element_bytes(mixed_precision),
        frozen_bytes_per_element=frozen[0].element_size() if frozen else 4,
        auto_buffers=auto_values(sizes),
        quantized_frozen_bytes=sum(w.numel() + 5 * w.shape[0] for w in quantized),  # + scale, zero point
        optimizer_state_bytes=int(sum(map(state_bytes, trainable))) if optimizer == "adamw_8bit" else None,
    )


def _stored_quantized(module: torch.nn.Module, base_precision: str) -> bool:
    """What engine.base_precision quantizes: a frozen nn.Linear, when the base is stored int8/fp8."""
    linear = isinstance(module, torch.nn.Linear)
    return base_precision != "full" and linear and not module.weight.requires_grad


def largest_fsdp_unit(model: torch.nn.Module, block_classes: Sequence[str]) -> int:
    """Elements of the largest FSDP2 unit: each instance of the task's block classes is one (the
    outermost, when blocks nest), and so are the input and the output embedding (accelerate carves them
    out: `fsdp2_prepare_model`); the root holds every other parameter."""
    blocks: list[torch.nn.Module] = []
    for module in model.modules():
        if type(module).__name__ in block_classes and not any(
            module in set(outer.modules()) for outer in blocks
        ):
            blocks.append(module)
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        embedding = getattr(model, getter, lambda: None)()
        if isinstance(embedding, torch.nn.Module) and all(embedding is not b for b in blocks):
            blocks.append(embedding)
    in_blocks: set[int] = set()
    sizes = []
    for block in blocks:
        own = [p for p in block.parameters() if id(p) not in in_blocks]
        in_blocks.update(id(p) for p in own)
        sizes.append(sum(p.numel() for p in own))
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    return max([root, *sizes])


def meta_model(task: Task) -> torch.nn.Module:
    """The model `task` trains, built on the meta device after `prepare_model_assets` (built-in tiny
    models; a classifier's head needs its classes): what the census counts and the probe runs."""
    planning_hooks(task).prepare_model_assets()
    with empty_weights():
        model = task.build_model()
    if task.config.train.checkpoint_blocks:  # as train/run.py does, so the probe measures its graph
        checkpoint_repeated_blocks(model, task.fsdp_block_classes(model))
    return model


@dataclass
class HelperModules:
    """A task's frozen helpers on the meta device, built once per plan: the census counts them, then
    the probe makes them fake (a VAE and a CLIP encoder take seconds to build, even on meta)."""

    frozen: list[torch.nn.Module]
    eval_only: list[torch.nn.Module]

    @property
    def in_evaluation(self) -> list[torch.nn.Module]:
        """Every helper on the device while evaluating or sampling."""
        return [*self.frozen, *self.eval_only]


def helper_modules(task: Task) -> HelperModules:
    hooks = planning_hooks(task)
    with empty_weights():
        return HelperModules(hooks.frozen_helpers(), hooks.eval_only_helpers())


def task_census(
    task: Task, model: torch.nn.Module | None = None, helpers: HelperModules | None = None
) -> ParameterCensus:
    """The census of the model `task` trains; `model`: its `meta_model`, and `helpers`: its
    `helper_modules`, when the caller has built them already (the planner builds each once for the
    census and the activation probe)."""
    model = meta_model(task) if model is None else model
    helpers = helper_modules(task) if helpers is None else helpers
    train = task.config.train
    base = task.config.model.base_precision
    census = census_of(model, helpers.frozen, train.mixed_precision, base, train.optimizer.name)
    compute = dtype_of(task.config.train.mixed_precision)
    in_evaluation = helpers.in_evaluation
    dtypes = planning_hooks(task).helper_dtypes(in_evaluation, compute)
    eval_bytes = sum(
        p.numel() * d.itemsize for h, d in zip(in_evaluation, dtypes, strict=True) for p in h.parameters()
    )
    unit = largest_fsdp_unit(model, task.fsdp_block_classes(model))
    return replace(census, eval_helper_bytes=max(0, eval_bytes - census.helper_bytes), largest_fsdp_unit=unit)


def config_census(config_path: Path | str, overrides: Sequence[str] = ()) -> ParameterCensus:
    config = load_run_config(config_path, overrides)
    return task_census(get_task_class(config.task)(config))
