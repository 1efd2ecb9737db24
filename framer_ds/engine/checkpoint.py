"""Resumable checkpoints: atomic writes with a manifest, keep-last-K (and the best), and the loop position
they hold.

`accelerator.save_state` / `load_state` are collectives (DeepSpeed writes one shard per rank), so they
run on every rank. A checkpoint is first written to `checkpoints/.tmp_step_N` and published as
`checkpoints/step_N` (fsynced, then renamed: `storage.atomic.publish_dir`) only after every rank
finished and `trainer_state.json` is in it: a job killed mid-save leaves the previous checkpoint
untouched and the half-written one invisible to resume. Resuming from one is `engine/resume/`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.loader import dump_run_config
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.best import BestRecord, read_best_record
from framer_ds.engine.checkpoint_weights import trained_state_only
from framer_ds.engine.manifest import write_manifest
from framer_ds.storage.atomic import publish_dir, staging_dir
from framer_ds.storage.disk_space import reporting_full_disk, tree_bytes

STATE_FILE = "trainer_state.json"
CHECKPOINT_CONFIG = "config.yaml"  # the resolved config that wrote the checkpoint
DEEPSPEED_CONFIG = "deepspeed.json"  # the DeepSpeed config as the engine ran it ("auto" resolved)
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Loop position: enough to continue with the same data order, LR and RNG."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    samples_seen: int = 0
    world_size: int = 1  # processes that wrote the checkpoint (a ZeRO checkpoint is sharded by it)
    # The best evaluation so far (train.eval.best_metric), so a resumed run replaces best/ only with a better
    # model. Checkpoints written before these fields existed load with them unset.
    best_metric: str | None = None  # the metric and mode the value was judged by: another one on resume
    best_mode: str | None = None  # makes the stored value meaningless, and it is forgotten
    best_value: float | None = None
    best_step: int | None = None
    skipped_steps: int = 0  # optimizer steps the engine skipped on an overflow (train/overflow.py)
    # What a stop signal put off at `global_step` (train/safe_point.py): the step actions (names) a run
    # resumed from this checkpoint does first, and the evaluation of that step they may read.
    deferred_actions: list[str] = field(default_factory=list)
    deferred_eval: dict[str, float] | None = None

    def forget_best_unless(self, metric: str | None, mode: str | None) -> None:
        """Keep the stored best only if it was judged by `metric` and `mode` (the config that runs now)."""
        if (self.best_metric, self.best_mode) != (metric, mode):
            self.best_metric, self.best_mode, self.best_value, self.best_step = metric, mode, None, None


def checkpoints_root(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_of(checkpoint: Path) -> int:
    """The optimizer step in a `step_N` directory's name."""
    match = _STEP_DIR.match(Path(checkpoint).name)
    if match is None:
        raise ValueError(f"{checkpoint} is not named step_N")
    return int(match.group(1))


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (incomplete `.tmp_*` directories are ignored)."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return [path for _, path in sorted(found)]


def newest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


@dataclass(frozen=True)
class BestCheckpoint:
    """The checkpoint that holds the run's best evaluation (`record`, from best/best.json)."""

    path: Path
    record: BestRecord

    def describe(self, with_step: bool = True) -> str:
        """Its metric, and where the checkpoint stands relative to the evaluation when they differ."""
        step = step_of(self.path)
        if step == self.record.step:
            return f"step {step}, {self.record.describe()}" if with_step else self.record.describe()
        where = "the newest checkpoint before the best evaluation"
        return (
            f"step {step}, {where}, {self.record.describe()}"
            if with_step
            else f"{where}, {self.record.describe()}"
        )


def best_checkpoint(output_dir: Path) -> BestCheckpoint | None:
    """The checkpoint of the best evaluation: the newest complete checkpoint at or before the step of
    best/best.json; None without best/ or when every checkpoint is newer than it.

    Why "at or before": evaluations and checkpoints have their own cadences. When they coincide (the
    evaluation runs before the checkpoint in the same step, train/actions.py) it is the checkpoint of the
    evaluated model itself; otherwise the last one before it, from which the same config retrains that
    model exactly. It is also the right one when the checkpoint at the best step was not written (its
    optimizer state was not finite): the previous one, finite, is the best that exists. Pruning never
    deletes it, so the choice cannot drift to an older checkpoint later."""
    record = read_best_record(output_dir)
    if record is None:
        return None
    earlier = [path for path in complete_checkpoints(output_dir) if step_of(path) <= record.step]
    return BestCheckpoint(earlier[-1], record) if earlier else None


def checkpoints_to_prune(output_dir: Path, keep_last: int) -> list[Path]:
    """Every complete checkpoint except the newest `keep_last` and the best one (`best_checkpoint`),
    which does not count against keep_last (as the HF Trainer keeps `best_model_checkpoint` beside
    `save_total_limit`): a run that diverges after its best evaluation still holds the checkpoint worth
    resuming (`train.resume=best`), however many worse ones it wrote since."""
    found = complete_checkpoints(output_dir)
    best = best_checkpoint(output_dir)
    kept = set(found[-keep_last:]) | ({best.path} if best is not None else set())
    return [path for path in found if path not in kept]


def save_checkpoint(
    accelerator: Accelerator,
    config: RunConfigBase,
    state: TrainerState,
    extra_artifacts: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint atomically on all ranks; prune to the newest `train.checkpoint.keep_last` plus
    the best one (`checkpoints_to_prune`). Call on EVERY rank.

    `extra_artifacts(tmp_dir)` runs on every rank before the rename (e.g. a task writes its LoRA adapter
    next to the resumable state), so it is published together with the checkpoint or not at all. The
    resolved config (what a resume compares against) and the manifest (written last) go in too."""
    output_dir, keep_last = Path(config.output_dir), config.train.checkpoint.keep_last
    root = checkpoints_root(output_dir)
    final = root / f"step_{state.global_step}"
    staging = staging_dir(final)  # one name every rank agrees on: each writes its shard into it
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with trained_state_only(accelerator) as kwargs:  # no frozen base weights (checkpoint_weights.py)
        accelerator.save_state(str(staging), **kwargs)
    if extra_artifacts is not None:
        extra_artifacts(staging)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state.world_size = accelerator.num_processes
        (staging / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        (staging / CHECKPOINT_CONFIG).write_text(dump_run_config(config))
        plugin = accelerator.state.deepspeed_plugin
        if plugin is not None:
            ran = json.dumps(plugin.deepspeed_config, indent=2, default=str)
            (staging / DEEPSPEED_CONFIG).write_text(ran + "\n")
        write_manifest(staging)
        publish_dir(staging, final)
        for old in checkpoints_to_prune(output_dir, keep_last):
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp_step_*"):  # left by saves killed before their rename
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def read_trainer_state(path: Path) -> TrainerState:
    """The loop position stored in a checkpoint (no tensors loaded)."""
    return TrainerState(**json.loads((Path(path) / STATE_FILE).read_text()))


def reporting_full_disk_during_save(output_dir: Path, step: int) -> AbstractContextManager[None]:
    """Wrap `save_checkpoint` of `step`: a full disk becomes one line (DiskFullError) naming the
    checkpoint directory and the bytes needed (the size of the newest checkpoint, the best estimate of
    the next one), after the partial `.tmp_step_N` is deleted; the previous checkpoint is never touched
    (nothing is published or pruned before every file of the new one is written)."""
    root, previous = checkpoints_root(output_dir), complete_checkpoints(output_dir)
    return reporting_full_disk(
        root,
        tree_bytes(previous[-1]) if previous else 0,
        staging_dir(root / f"step_{step}"),
        kept=f"{previous[-1].name} is kept" if previous else "no earlier checkpoint exists",
        fix="Free space there (or set output_dir on a larger disk) and resume with train.resume=latest",
    )
