"""fp16 loss scaling as the engines run it: whether an optimizer step was skipped, and the scale.

Why: under fp16 the loss is multiplied by a scale so that small gradients survive the cast; when a
gradient overflows at that scale (inf/NaN), the engine does not update the weights at all, lowers the
scale and goes on. The training loop must know, or it counts a step that trained nothing.
- DeepSpeed's loss scaler (ZeRO-1/2/3, offload): the ZeRO optimizer's `overflow`, set by the step the
  engine takes inside the window's last `backward` ("OVERFLOW! Skipping step"); accelerate's
  `DeepSpeedOptimizerWrapper.step_was_skipped` returns it, and `engine.was_step_applied()` is made of it.
  A hysteresis > 1 skips steps without lowering the scale, so the flag is read, not the scale.
  ZeRO also skips an fp32 step whose gradient norm is not finite (bf16 only with its
  `check_grad_overflow`), reported alike.
- torch's GradScaler (plain, DDP and FSDP2 runs with fp16): accelerate's `AcceleratedOptimizer.
  step_was_skipped` only knows whether `scaler.step` called the optimizer's `step`. framer_ds's AdamW is
  fused (`train/run.py`), and GradScaler hands a fused optimizer its inf flag and always calls its
  `step`, which then updates nothing: `step_was_skipped` stays False on every overflow. What tells is the
  scale: `scaler.update()` multiplies it by `backoff_factor` (< 1, GradScaler refuses others) exactly
  when an inf/NaN gradient was found, and only grows it otherwise.
Both decisions are already agreed over the ranks (DeepSpeed all-reduces its overflow check, the
gradients DDP averaged are the same on every rank, and an FSDP2 DTensor's inf check is reduced over its
mesh), so every rank skips the same steps without another collective.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from framer_ds.engine.accelerator import uses_deepspeed


def scale_before_step(accelerator: Accelerator) -> torch.Tensor | None:
    """A copy of the GradScaler's scale, taken right before the optimizer step (no device sync), for
    `step_was_skipped`; None where the step's own flag is read (DeepSpeed, or no loss scaling)."""
    scaler = accelerator.scaler
    if uses_deepspeed(accelerator) or scaler is None or not scaler.is_enabled():
        return None
    scale = scaler._get_scale_async()  # None before the first `scaler.scale(loss)`
    return None if scale is None else scale.detach().clone()


def step_was_skipped(accelerator: Accelerator, optimizer: object, scale_before: torch.Tensor | None) -> bool:
    """Whether the optimizer step just taken (`optimizer` is the prepared one) updated nothing because
    of an overflow. With `scale_before` (GradScaler): whether the scale backed off, one device sync;
    without: the engine's own flag (DeepSpeed), False for an optimizer that never skips."""
    if scale_before is not None:
        return bool(accelerator.scaler._get_scale_async() < scale_before)
    return bool(getattr(optimizer, "step_was_skipped", False))


def current_loss_scale(accelerator: Accelerator, model: torch.nn.Module, optimizer: object) -> float | None:
    """The loss scale the next step will use (after the engine's back-off or growth), or None when this
    run scales no loss (fp32 and bf16: DeepSpeed keeps a fixed scale of 1 there, torch no scaler).

    A device sync on a GPU (the scale is a tensor there): read it once per log line, not per micro-batch.
    """
    if uses_deepspeed(accelerator):
        fp16_enabled = getattr(model, "fp16_enabled", None)  # the DeepSpeedEngine prepare returned
        if fp16_enabled is None or not fp16_enabled():
            return None
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper -> the ZeRO optimizer
        scale = getattr(inner, "cur_scale", None)
        return None if scale is None else float(scale)
    scaler = accelerator.scaler
    if scaler is None or not scaler.is_enabled():
        return None
    return float(scaler.get_scale())
