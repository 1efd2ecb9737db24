"""Measure a config's activation memory without weights, data or the memory itself: the planner's second
input.

How: the task's model is built on the meta device (`engine.pretrained.empty_weights`), its parameters
become fake tensors (`torch._subclasses.FakeTensorMode`: shapes, dtypes and devices, no storage), and one
forward + backward of the task's own `training_loss` on its planning hook `example_batch(k)` runs under
lab/activation_tracker.py, which follows every tensor's storage through autograd (the figures of
PyTorch's `MemTracker`, without its per-module books). What is kept is the peak of activations plus
backward temporaries (gradients of activations) over the whole step - not weights, gradients or
optimizer states, which the memory model counts. Run at
two micro-batch sizes, the two peaks give a line, fixed + per-sample x k: the planner reads it at any
micro-batch. It is the real model's real graph (gradient checkpointing, LoRA, the loss's float upcasts
included) at full size, in seconds, on a laptop.

Depth: a fake step costs Python time per operation, so a 40-block 14B transformer took minutes. Where the
model's repeated blocks (the task's `fsdp_block_classes`) are one ModuleList of identical blocks, the
probe runs the model cut to 2 and to 3 blocks and extends the line to the full depth: each block
keeps the same activations (its saved tensors, or only its input under checkpointing) and runs the same
backward temporaries, so the peak grows by the same bytes per block and the figure is exact, not an
estimate (tests/lab/test_probe_depth.py compares it with the full-depth probe). Any other shape (several
stacks, blocks that differ, a UNet) is probed whole.

The device: fake tensors are made on the GPU when one is present, else on the CPU, so the kernels chosen
are that device's (attention saves what the device's SDPA kernel saves). Not in it: the caching
allocator's rounding and fragmentation (the planner's stated allowance covers them), and the no_grad
VAE/encoder transient of a video run without a latent cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import send_to_device

from framer_ds.engine.precision import cast_batch, dtype_of
from framer_ds.lab.activation_probe import ActivationProbe
from framer_ds.lab.activation_tracker import ActivationTracker
from framer_ds.lab.census import helper_modules, meta_model
from framer_ds.lab.probe_passes import run_passes
from framer_ds.tasks.base import Task, TrainingLoss
from framer_ds.tasks.planning import planning_hooks
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

PROBE_MICRO_BATCHES = (1, 2)
PROBE_DEPTHS = (2, 3)
"""The block counts a model with one stack of identical blocks is probed at (module docstring)."""


def _loss_of(result: torch.Tensor | TrainingLoss) -> torch.Tensor:
    return result.loss if isinstance(result, TrainingLoss) else result


def repeated_stack(model: torch.nn.Module, block_classes: Sequence[str]) -> torch.nn.ModuleList | None:
    """The one ModuleList that holds every instance of the task's block classes, when its blocks are
    alike (same class, parameter names, shapes, dtypes and trainability; a config that gives layers
    different types, e.g. sliding-window ones, rules it out) and there are more than PROBE_DEPTHS[-1]
    of them; else None, and the probe runs the whole model."""
    wanted = set(block_classes)
    stacks = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) and all(type(b).__name__ in wanted for b in m)
    ]
    if len(stacks) != 1 or len(stacks[0]) <= PROBE_DEPTHS[-1]:
        return None
    stack = stacks[0]
    inside = {id(m) for m in stack.modules()}
    if any(type(m).__name__ in wanted and id(m) not in inside for m in model.modules()):
        return None  # blocks outside the stack (a second stack, an encoder's own)
    layer_types = getattr(getattr(model, "config", None), "layer_types", None)
    if layer_types is not None and len(set(layer_types)) > 1:
        return None

    def signature(block: torch.nn.Module) -> tuple:
        params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in block.named_parameters())
        return type(block), params

    first = signature(stack[0])
    return stack if all(signature(block) == first for block in stack) else None


@contextlib.contextmanager
def _cut_to(stack: torch.nn.ModuleList | None, depth: int | None):
    """`stack` holding only its first `depth` blocks inside the block (None: left whole)."""
    if stack is None or depth is None:
        yield
        return
    blocks = list(stack)
    del stack[depth:]
    try:
        yield
    finally:
        stack.extend(blocks[depth:])


def _extend(at: Sequence[int], depths: Sequence[int], full: int) -> int:
    """The line through (depths[0], at[0]) and (depths[1], at[1]) read at `full` blocks (exact integers:
    the depths are one apart)."""
    (n1, n2), (m1, m2) = depths, at
    return m2 + (m2 - m1) * (full - n2) // (n2 - n1)


def probe_activations(
    task: Task,
    micro_batches: Sequence[int] = PROBE_MICRO_BATCHES,
    fake: bool = True,
    model: torch.nn.Module | None = None,
    with_eval: bool = True,
    helpers: list[torch.nn.Module] | None = None,
    scale_depth: bool = True,
) -> ActivationProbe:
    """One forward + backward per micro-batch size of `task`'s model on fake tensors (module docstring).
    `fake=False` runs the same step on real tensors with real (random) weights: the check that the fake
    run follows the same graph, for models small enough to run. `model`: the task's `meta_model` when
    the caller built it already; the probe gives it fake (or empty) parameters, so count it first.
    `with_eval`: also measure the evaluation transient (the planning hook `eval_transient`, with the
    helpers on the device in `helper_dtypes`, tasks/planning.py); `helpers`:
    `HelperModules.in_evaluation` on the meta device, when the caller built them for the census (the
    probe makes them fake). `scale_depth=False` runs a stack of identical blocks at its full depth too
    (the check that the extended figures are exact)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if len(set(micro_batches)) < 2:
        raise ValueError(f"need two different micro-batch sizes to fit a line, got {list(micro_batches)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = dtype_of(task.config.train.mixed_precision)
    model = meta_model(task) if model is None else model
    stack = repeated_stack(model, task.fsdp_block_classes(model)) if scale_depth else None
    if dtype != torch.float32:  # as DeepSpeed casts the module (DDP's autocast computes in it too)
        model.to(dtype)  # still on the meta device: fake parameters cannot be swapped for a cast
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    _to_empty(model, mode, device)
    if with_eval:
        helpers = helper_modules(task).in_evaluation if helpers is None else helpers
        _make_helpers(task, helpers, mode, device, dtype)
    depths = PROBE_DEPTHS if stack is not None else (None,)

    def step(depth: int | None, k: int) -> Callable[[], int]:
        def run() -> int:
            with _cut_to(stack, depth):
                return _step_peak(task, model, k, mode, device, dtype)

        return run

    def evaluation(depth: int | None) -> Callable[[], int]:
        def run() -> int:
            with _cut_to(stack, depth):
                return _eval_transient_peak(task, model, helpers, mode, device, dtype)

        return run

    passes: list[Callable[[], int]] = []  # independent: side by side on the usable cores (probe_passes.py)
    for depth in depths:
        passes += [step(depth, k) for k in micro_batches] + ([evaluation(depth)] if with_eval else [])
    peaks, width = run_passes(passes), len(passes) // len(depths)
    runs = []  # (peak at each micro-batch, eval peak) at each probed depth
    for chunk in (peaks[i : i + width] for i in range(0, len(peaks), width)):
        runs.append((chunk[: len(micro_batches)], chunk[len(micro_batches)] if with_eval else 0))
    if stack is None:
        (measured, eval_peak), depth = runs[0], ()
    else:
        measured = [_extend(at, PROBE_DEPTHS, len(stack)) for at in zip(*(m for m, _ in runs), strict=True)]
        eval_peak = _extend([e for _, e in runs], PROBE_DEPTHS, len(stack))
        depth = (*PROBE_DEPTHS, len(stack))
    (k1, k2), (m1, m2) = micro_batches[:2], measured[:2]
    per_sample = max(0, round((m2 - m1) / (k2 - k1)))
    return ActivationProbe(
        micro_batches=tuple(micro_batches),
        measured_bytes=tuple(measured),
        fixed=m1 - per_sample * k1,
        per_sample=per_sample,
        gradient_checkpointing=bool(task.config.train.gradient_checkpointing),
        device=device,
        eval_transient=eval_peak,
        depth=depth,
    )


def _step_peak(task: Task, model: torch.nn.Module, k: int, mode: Any, device: str, dtype: torch.dtype) -> int:
    """Peak activations + temporaries of one training forward + backward at micro-batch `k`."""
    model.train()
    batch = cast_batch(planning_hooks(task).example_batch(k), dtype, task.full_precision_keys)
    tracker = ActivationTracker()
    with mode, tracker:
        _loss_of(task.training_loss(model, send_to_device(batch, device))).backward()
    model.zero_grad(set_to_none=True)
    return tracker.activation_peak


def _make_helpers(
    task: Task, helpers: list[torch.nn.Module], mode: Any, device: str, dtype: torch.dtype
) -> None:
    """`helpers` (on the meta device) cast to the dtypes they run in and made fake (or empty)."""
    hooks = planning_hooks(task)
    for helper, helper_dtype in zip(helpers, hooks.helper_dtypes(helpers, dtype), strict=True):
        helper.requires_grad_(False).eval().to(helper_dtype)  # still meta: the cast costs nothing
    for helper in helpers:
        _to_empty(helper, mode, device)


def _to_empty(module: torch.nn.Module, mode: Any, device: str) -> None:
    """`module.to_empty(device=device)` in `mode`: fake (or real but empty) parameters and buffers.

    Why not `to_empty` itself in fake mode: its `empty_like` goes through FakeTensorMode's Python dispatch
    (a decomposition, uncached), ~1-3 ms a tensor, seconds for the ~3,000 tensors of a UNet and its helpers,
    all before the probe's passes can run side by side. A fake tensor is a fresh meta tensor that says
    `device`: made so directly (what the fake mode makes of any meta tensor), it has the same shape,
    strides, dtype and a storage of its own, as `empty_like` gave it (tests/lab/test_probe_passes.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not isinstance(mode, FakeTensorMode):
        module.to_empty(device=device)
        return
    target, converter = torch.device(device), mode.fake_tensor_converter

    def fake_empty(tensor: torch.Tensor) -> torch.Tensor:
        meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
        return converter.from_meta_and_device(mode, meta, target)

    module._apply(fake_empty)


def _eval_transient_peak(
    task: Task,
    model: torch.nn.Module,
    helpers: list[torch.nn.Module],
    mode: Any,
    device: str,
    dtype: torch.dtype,
) -> int:
    """The task's `eval_transient` under the tracker, in the probe's fake mode, with `helpers` made
    ready by `_make_helpers`."""
    hooks = planning_hooks(task)
    batch = send_to_device(cast_batch(hooks.example_batch(2), dtype, task.full_precision_keys), device)
    model.eval()
    tracker = ActivationTracker()
    try:
        with mode, tracker:
            hooks.eval_transient(model, helpers, batch)
    finally:
        model.train()
    return tracker.activation_peak


def probe_config(
    config_path: Path | str, overrides: Sequence[str] = (), gradient_checkpointing: bool | None = None
) -> ActivationProbe:
    """The probe of a config file; `gradient_checkpointing` True/False overrides the config's setting."""
    extra = (
        [] if gradient_checkpointing is None else [f"train.gradient_checkpointing={gradient_checkpointing}"]
    )
    config = load_run_config(config_path, [*overrides, *extra])
    return probe_activations(get_task_class(config.task)(config))
