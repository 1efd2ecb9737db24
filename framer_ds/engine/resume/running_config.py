"""After `load_state`: the optimizer and LR schedule follow the config that runs now, not the checkpoint's.

`load_state` restores the param groups (lr, weight decay, betas, eps) and the scheduler's base learning
rates of the run that wrote the checkpoint, so a learning rate changed on resume used to be ignored while
config.yaml claimed it. Only the optimizer, the scheduler and `train` are needed: this is engine work.
"""

from __future__ import annotations

import torch

from framer_ds.config.schema import TrainConfig


def lr_scales(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's learning rate over the main one (`lr_scale`, set when the optimizer is built
    from the running config; 1 for a group without it). Read BEFORE `load_state`, which replaces the
    groups with the checkpoint's."""
    live = getattr(optimizer, "optimizer", optimizer)
    return [float(group.get("lr_scale", 1.0)) for group in live.param_groups]


def apply_running_config(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train: TrainConfig,
    scales: list[float] | None = None,
) -> None:
    """Make the restored optimizer and schedule follow `train` (the config that runs now), each param
    group at its own `scales` entry (`lr_scales` of the freshly built optimizer) times the main rate.

    The schedule's shape (warmup, total steps, kind) is already the new one: LambdaLR keeps the lambdas
    it was built with. With an unchanged config this recomputes the same values bit for bit."""
    rebind_scheduler_to_live_optimizer(optimizer, scheduler)
    inner = getattr(scheduler, "scheduler", scheduler)
    live = getattr(optimizer, "optimizer", optimizer)
    scales = scales if scales is not None else [1.0] * len(live.param_groups)
    for group, scale in zip(live.param_groups, scales, strict=True):
        group.update(
            # the group train/run.py exempts (biases, norm weights) stays exempt
            weight_decay=0.0 if group.get("no_decay") else train.optimizer.weight_decay,
            betas=(train.optimizer.beta1, train.optimizer.beta2),
            eps=train.optimizer.epsilon,
            lr_scale=scale,
        )
    lambdas = getattr(inner, "lr_lambdas", None)
    if lambdas is None:  # not a LambdaLR: keep what was restored
        return
    inner.base_lrs = [train.optimizer.learning_rate * scale for scale in scales]
    lrs = [base * fn(inner.last_epoch) for base, fn in zip(inner.base_lrs, lambdas, strict=True)]
    for group, lr in zip(live.param_groups, lrs, strict=True):
        group["lr"] = lr
    inner._last_lr = lrs


def rebind_scheduler_to_live_optimizer(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> None:
    """Point the LR scheduler at the optimizer that really steps, after `load_state`.

    With DeepSpeed optimizer offload accelerate replaces our torch AdamW by DeepSpeedCPUAdam; the
    scheduler keeps the discarded AdamW, which shares its param-group dicts with the new optimizer
    only until `load_state_dict` swaps them for new ones. Without this, a resumed offload run logs a
    decaying LR while really training at the LR of the checkpoint step forever.
    """
    inner = getattr(scheduler, "scheduler", scheduler)
    live = getattr(optimizer, "optimizer", optimizer)
    inner.optimizer = live
    for group, lr in zip(live.param_groups, inner.get_last_lr(), strict=True):
        group["lr"] = lr
