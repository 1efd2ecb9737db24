"""Resume as one object: `ResumePlan.decide` before `accelerator.prepare`, `plan.restore` after it.

Why: the loop used to make nine calls into five modules to resume, their order kept in comments. The
order is now the object's: deciding needs nothing built (and must run before prepare: it may enable
DeepSpeed's `load_universal`); restoring needs the prepared optimizer and scheduler. Each rule has one
home in this package:
- `choice.py`: which checkpoint (manifests, `latest` falling back over damaged ones, `best`, rank 0
  decides);
- `changes.py`: what the running config may change from the checkpoint's (refused vs applied);
- `strategy.py` + `universal.py`: whether it loads under the running strategy, and from which directory;
- `zero3_groups.py`: per-group step counts and settings that DeepSpeed's ZeRO-3 universal loader loses;
- `running_config.py`: the restored optimizer and schedule follow the running config (e.g. a new LR);
- `world_size.py`: the data position and RNG at another number of processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator

from framer_ds.config.schema import RunConfigBase, TrainConfig
from framer_ds.engine.checkpoint import TrainerState, read_trainer_state
from framer_ds.engine.checkpoint_weights import trained_state_only
from framer_ds.engine.resume.changes import resume_changes
from framer_ds.engine.resume.choice import decide_checkpoint
from framer_ds.engine.resume.running_config import apply_running_config, lr_scales
from framer_ds.engine.resume.strategy import directory_to_load
from framer_ds.engine.resume.universal import is_universal
from framer_ds.engine.resume.world_size import adapt_to_world_size
from framer_ds.engine.resume.zero3_groups import restore_zero3_group_state


@dataclass(frozen=True)
class ResumePlan:
    """What a run continues from: nothing (a fresh run), or a checkpoint and the directory to load it from.

    `checkpoint` is the verified `step_N` that was chosen; `load_from` is that directory or its universal
    conversion (a ZeRO checkpoint at another world size); `stored` its trainer_state.json as written;
    `changes` the "key: old -> new" lines the running config applies on top of it."""

    checkpoint: Path | None = None
    load_from: Path | None = None
    stored: TrainerState | None = None
    changes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def step(self) -> int | None:
        """The optimizer step the run continues after; None for a fresh run."""
        return self.stored.global_step if self.stored is not None else None

    @classmethod
    def decide(
        cls,
        accelerator: Accelerator,
        config: RunConfigBase,
        on_chosen: Callable[[int, Path], None] | None = None,
    ) -> ResumePlan:
        """Choose the checkpoint `config.train.resume` names, refuse the config changes that would change
        the run's meaning, check it loads under this launch (converting it for another world size). Every
        rank, before `accelerator.prepare`. Nothing is loaded. `on_chosen(step, checkpoint)` hears the
        choice at once (a stop during a long conversion still names the checkpoint)."""
        train = config.train
        checkpoint = decide_checkpoint(
            accelerator, Path(config.output_dir), train.resume, train.eval.best_metric
        )
        if checkpoint is None:
            return cls()
        stored = read_trainer_state(checkpoint)
        if on_chosen is not None:
            on_chosen(stored.global_step, checkpoint)
        changes = tuple(resume_changes(checkpoint, config, stored, accelerator.num_processes))
        if accelerator.is_main_process:
            for line in changes:
                print(f"changed on resume: {line}", flush=True)
        load_from = directory_to_load(accelerator, checkpoint)
        return cls(checkpoint, load_from, stored, changes)

    def restore(
        self,
        accelerator: Accelerator,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        train: TrainConfig,
        batches_per_epoch: int,
    ) -> TrainerState:
        """Load the checkpoint into the prepared model, optimizer, scheduler and RNGs (collective: every
        rank), make optimizer and schedule follow `train`, and return the loop position at this world
        size. A fresh run's plan loads nothing and returns TrainerState()."""
        if self.load_from is None:
            return TrainerState()
        scales = lr_scales(optimizer)  # the running config's, before the checkpoint's replace them
        with trained_state_only(accelerator, loading=True) as kwargs:  # frozen weights: from the base
            accelerator.load_state(str(self.load_from), **kwargs)
        if is_universal(self.load_from):  # DeepSpeed's ZeRO-3 universal loader is exact per parameter only
            restore_zero3_group_state(optimizer, self.load_from)
        state = read_trainer_state(self.load_from)
        apply_running_config(optimizer, scheduler, train, scales)
        state = adapt_to_world_size(accelerator, state, self.load_from, train, batches_per_epoch)
        if accelerator.is_main_process:
            print(f"resumed from {self.checkpoint} at step {state.global_step}", flush=True)
        return state
