"""The ONE training loop: accumulate -> backward -> clip -> step -> log -> eval -> checkpoint.

It never knows which task it runs: the task supplies model, data, loss, eval values and export.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_scheduler

from framer_ds.config.errors import ConfigError
from framer_ds.config.launch_check import check_runtime_environment
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.accelerator import build_accelerator, frozen_model_init, uses_deepspeed
from framer_ds.engine.checkpoint import (
    TrainerState,
    load_checkpoint,
    read_trainer_state,
    resolve_resume,
    save_checkpoint,
)
from framer_ds.engine.metrics import MetricsLogger, memory_stats
from framer_ds.engine.run_dir import check_run_dir, prepare_run_dir
from framer_ds.engine.universal import adapt_to_world_size, prepare_resume
from framer_ds.tasks.base import Task
from framer_ds.tasks.registry import get_task_class
from framer_ds.train.batch import to_compute_dtype
from framer_ds.train.evaluate import evaluate
from framer_ds.train.faults import (
    NonFiniteLossError,
    NonFiniteTracker,
    Preempted,
    StopRequest,
    exchange_flags,
    write_preempted_marker,
)
from framer_ds.train.schedule import StepPlan, plan_steps


@dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    eval_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Run:
    """Everything `prepare` returned, bundled so helpers take one argument."""

    accelerator: Accelerator
    task: Task
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader
    eval_loader: DataLoader | None
    plan: StepPlan


def run_training(config: RunConfigBase) -> TrainResult:
    """Train `config.task` as configured; raises ConfigError on bad config before any heavy work."""
    task = get_task_class(config.task)(config)
    problems = task.check() + check_runtime_environment(config.train, task.model_has_hidden_size)
    if problems:
        raise ConfigError(problems, "pre-flight checks")
    check_run_dir(config)
    accelerator = build_accelerator(config, collective_timeout_s=config.train.collective_timeout_s)
    resume_path = resolve_resume(config.output_dir, config.train.resume)
    load_path = resume_path  # a ZeRO checkpoint resumed at another world size loads from its conversion
    if resume_path is not None:
        load_path = prepare_resume(accelerator, resume_path)  # before prepare: may set load_universal
    prepare_run_dir(accelerator, config, read_trainer_state(resume_path).global_step if resume_path else None)

    set_seed(config.train.seed)
    # Runs on the local main process while the others wait: building a model here under ZeRO-3 init
    # would start collectives the waiting ranks never join (a deadlock), hence frozen_model_init.
    with accelerator.local_main_process_first(), frozen_model_init(accelerator):
        task.prepare_data()
    run = _build(accelerator, task, config)
    state = load_checkpoint(accelerator, load_path) if load_path is not None else TrainerState()
    if load_path is not None:
        _rebind_scheduler_to_live_optimizer(run)
        state = adapt_to_world_size(accelerator, state, load_path, config.train, run.plan.batches_per_epoch)
        accelerator.print(f"resumed from {resume_path} at step {state.global_step}")
    logger = MetricsLogger(accelerator, config)
    try:
        eval_metrics = _train(run, config, state, logger)
        _export(run, Path(config.output_dir))
    finally:
        logger.close()
    return TrainResult(Path(config.output_dir), state.global_step, eval_metrics)


def _rebind_scheduler_to_live_optimizer(run: _Run) -> None:
    """Point the LR scheduler at the optimizer that really steps, after `load_state`.

    With DeepSpeed optimizer offload accelerate replaces our torch AdamW by DeepSpeedCPUAdam; the
    scheduler keeps the discarded AdamW, which shares its param-group dicts with the new optimizer
    only until `load_state_dict` swaps them for new ones. Without this, a resumed offload run logs a
    decaying LR while really training at the LR of the checkpoint step forever.
    """
    inner = getattr(run.scheduler, "scheduler", run.scheduler)
    live = getattr(run.optimizer, "optimizer", run.optimizer)
    inner.optimizer = live
    for group, lr in zip(live.param_groups, inner.get_last_lr(), strict=True):
        group["lr"] = lr


def _build(accelerator: Accelerator, task: Task, config: RunConfigBase) -> _Run:
    train_cfg = config.train
    train_set, eval_set = task.build_datasets()
    task.setup_frozen(accelerator)
    train_set, eval_set = task.precompute(accelerator, train_set, eval_set)
    model = task.build_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise RuntimeError(f"task {task.name!r} built a model with no trainable parameters")
    optimizer = torch.optim.AdamW(
        trainable,
        lr=train_cfg.learning_rate,
        betas=(train_cfg.adam_beta1, train_cfg.adam_beta2),
        eps=train_cfg.adam_epsilon,
        weight_decay=train_cfg.weight_decay,
    )
    loader_kwargs = {
        "batch_size": train_cfg.micro_batch_size,
        "collate_fn": task.collate_fn(),
        "num_workers": train_cfg.num_workers,
        "pin_memory": torch.cuda.is_available(),
        "persistent_workers": train_cfg.num_workers > 0,
    }
    # The loader's own generator: PyTorch otherwise draws each epoch iterator's base seed from the
    # global RNG, which on resume would shift the dropout/augmentation stream restored by load_state.
    shuffle_generator = torch.Generator().manual_seed(train_cfg.seed)
    train_loader = DataLoader(
        train_set, shuffle=True, drop_last=True, generator=shuffle_generator, **loader_kwargs
    )
    eval_loader = DataLoader(eval_set, shuffle=False, **loader_kwargs) if eval_set is not None else None
    plan = plan_steps(len(train_set), train_cfg, accelerator.num_processes)
    scheduler = get_scheduler(
        train_cfg.lr_scheduler,
        optimizer,
        num_warmup_steps=train_cfg.warmup_steps,
        num_training_steps=plan.total_steps,
    )
    if eval_loader is not None:
        model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, eval_loader, scheduler
        )
    else:
        model, optimizer, train_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, scheduler
        )
    if len(train_loader) != plan.batches_per_epoch:
        raise RuntimeError(
            f"internal: planned {plan.batches_per_epoch} batches per epoch, the prepared loader has "
            f"{len(train_loader)}; please report this with your launch command"
        )
    return _Run(accelerator, task, model, optimizer, scheduler, train_loader, eval_loader, plan)


class _Window:
    """Losses of the micro-batches in the current optimizer step (accumulation window)."""

    def __init__(self, device: torch.device):
        self.loss_sum = torch.zeros((), device=device)
        self.batches = 0
        self.poisoned = False

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.batches = 0
        self.poisoned = False


def _train(run: _Run, config: RunConfigBase, state: TrainerState, logger: MetricsLogger) -> dict[str, float]:
    stop = StopRequest()
    stop.install()
    try:
        return _train_until_done(run, config, state, logger, stop)
    finally:
        stop.uninstall()


def _train_until_done(
    run: _Run, config: RunConfigBase, state: TrainerState, logger: MetricsLogger, stop: StopRequest
) -> dict[str, float]:
    accelerator, model, train_cfg, plan = run.accelerator, run.model, config.train, run.plan
    progress = tqdm(
        total=plan.total_steps,
        initial=state.global_step,
        desc="train",
        disable=not accelerator.is_local_main_process,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    nonfinite = NonFiniteTracker(train_cfg.nonfinite_loss, train_cfg.max_consecutive_nonfinite)
    window = _Window(accelerator.device)
    logged = torch.zeros((), device=accelerator.device)  # sum of step losses since the last log line
    logged_steps = 0
    tick = time.perf_counter()
    grad_norm: float | None = None
    eval_metrics: dict[str, float] = {}
    last_finite_batch = None
    model.train()
    while state.global_step < plan.total_steps:
        run.train_loader.set_epoch(state.epoch)
        loader = run.train_loader
        if state.batches_in_epoch:
            loader = accelerator.skip_first_batches(run.train_loader, state.batches_in_epoch)
        consumed_any = False
        for batch in loader:
            consumed_any = True
            batch = to_compute_dtype(accelerator, batch, run.task.full_precision_keys)
            with accelerator.accumulate(model):
                loss = run.task.training_loss(model, batch)
                bad, stop_requested = exchange_flags(
                    accelerator, not bool(torch.isfinite(loss.detach()).all()), stop.requested
                )
                if bad:
                    window.poisoned = True
                else:
                    last_finite_batch = batch
                    window.loss_sum += loss.detach().float()
                    window.batches += 1
                if not window.poisoned:
                    accelerator.backward(loss)
                elif accelerator.sync_gradients and uses_deepspeed(accelerator):
                    _close_poisoned_deepspeed_window(run, last_finite_batch, state.global_step)
                if accelerator.sync_gradients and not window.poisoned:
                    if train_cfg.max_grad_norm > 0:
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), train_cfg.max_grad_norm)
                    run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
            state.batches_in_epoch += 1
            if state.batches_in_epoch == plan.batches_per_epoch:
                state.epoch, state.batches_in_epoch = state.epoch + 1, 0
            if not accelerator.sync_gradients:
                continue
            nonfinite.record_window(window.poisoned, state.global_step)
            if window.poisoned:
                accelerator.print(f"non-finite loss: optimizer step {state.global_step + 1} skipped")
                logger.log({"nonfinite_skipped_steps": float(nonfinite.skipped_total)}, state.global_step)
                window.reset()
                continue
            run.scheduler.step()
            state.global_step += 1
            samples = plan.global_batch // train_cfg.gradient_accumulation_steps * window.batches
            state.samples_seen += samples
            logged += window.loss_sum / window.batches
            logged_steps += 1
            window.reset()
            progress.update(1)
            done = state.global_step >= plan.total_steps
            if state.global_step % train_cfg.log_every == 0 or done:
                now = time.perf_counter()
                loss_value = accelerator.reduce(logged / logged_steps, reduction="mean").item()
                line = {
                    "loss": loss_value,
                    "lr": run.scheduler.get_last_lr()[0],
                    "epoch": state.epoch + state.batches_in_epoch / plan.batches_per_epoch,
                    "samples": float(state.samples_seen),
                    "samples_per_s": samples * logged_steps / max(now - tick, 1e-9),
                    **memory_stats(),
                }
                if grad_norm is not None:
                    line["grad_norm"] = float(grad_norm)
                logger.log(line, state.global_step)
                progress.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
                logged.zero_()
                logged_steps = 0
                tick = time.perf_counter()
            if run.eval_loader is not None and (
                done or (train_cfg.eval_every and state.global_step % train_cfg.eval_every == 0)
            ):
                eval_metrics = evaluate(
                    accelerator, run.task, model, run.eval_loader, train_cfg.max_eval_batches
                )
                logger.log(eval_metrics, state.global_step)
                accelerator.print(_format_metrics(state.global_step, eval_metrics))
                tick = time.perf_counter()  # eval time is not training throughput
            sample_every = run.task.sample_every()
            if sample_every and (done or state.global_step % sample_every == 0):
                written = run.task.write_samples(
                    accelerator, model, state.global_step, Path(config.output_dir) / "samples"
                )
                logger.log_media("samples", written, state.global_step)
                tick = time.perf_counter()
            checkpoint_due = train_cfg.checkpoint_every and (
                done or state.global_step % train_cfg.checkpoint_every == 0
            )
            if checkpoint_due or stop_requested:
                path = save_checkpoint(
                    accelerator,
                    config.output_dir,
                    state,
                    train_cfg.keep_last_checkpoints,
                    extra_artifacts=lambda directory: run.task.checkpoint_artifacts(
                        accelerator, model, directory
                    ),
                )
                if stop_requested:
                    signal_name = stop.signal_name or "a stop signal on another rank"
                    if accelerator.is_main_process:
                        write_preempted_marker(config.output_dir, state.global_step, signal_name, path)
                    progress.close()
                    raise Preempted(state.global_step, signal_name)
                tick = time.perf_counter()  # nor is checkpoint time
            if done:
                break
        if not consumed_any:
            raise RuntimeError(f"epoch {state.epoch} yielded no batches; the training set looks empty")
    progress.close()
    return eval_metrics


def _close_poisoned_deepspeed_window(run: _Run, finite_batch, step: int) -> None:
    """DeepSpeed steps inside the boundary `backward`, so a poisoned window cannot simply skip it.

    Close the window with a zero-gradient backward on the last finite batch while every param
    group's LR is 0 (weights unchanged), then undo the scheduler tick the engine made.
    """
    if finite_batch is None:
        raise NonFiniteLossError(
            f"non-finite loss in the first optimizer step ({step + 1}) before any finite batch; "
            "check the data and the model initialisation"
        )
    optimizer = run.optimizer
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    zero_loss = run.task.training_loss(run.model, finite_batch) * 0.0
    run.accelerator.backward(zero_loss)
    inner = getattr(run.scheduler, "scheduler", run.scheduler)
    inner.last_epoch -= 1
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr
    inner._last_lr = saved


def _export(run: _Run, output_dir: Path) -> None:
    """Write `final/` atomically: into `.tmp_final`, renamed once complete (all ranks take part)."""
    accelerator = run.accelerator
    final, tmp = output_dir / "final", output_dir / ".tmp_final"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    run.task.export(accelerator, run.model, tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def _format_metrics(step: int, metrics: dict[str, float]) -> str:
    return f"step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
