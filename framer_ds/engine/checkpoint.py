"""Resumable checkpoints: atomic writes, keep-last-K, and finding the newest COMPLETE one.

`accelerator.save_state` / `load_state` are collectives (DeepSpeed writes one shard per rank), so they
run on every rank. A checkpoint is first written to `checkpoints/.tmp_step_N` and published as
`checkpoints/step_N` (fsynced, then renamed: `storage.atomic.publish_dir`) only after every rank
finished and `trainer_state.json` is in it: a job killed mid-save leaves the previous checkpoint
untouched and the half-written one invisible to resume.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import publish_dir, staging_dir

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Loop position: enough to continue with the same data order, LR and RNG."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    samples_seen: int = 0
    world_size: int = 1  # processes that wrote the checkpoint (a ZeRO checkpoint is sharded by it)


def checkpoints_root(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


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


def resolve_resume(output_dir: Path, resume: str | None) -> Path | None:
    """`null` -> None, `latest` -> newest complete checkpoint (None if there is none), else a path."""
    if resume is None:
        return None
    if resume == "latest":
        found = complete_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise ConfigError(
            [
                ConfigProblem(
                    "train.resume",
                    f"{path} is not a complete framer_ds checkpoint (no {STATE_FILE}); point it at "
                    f"output_dir/checkpoints/step_N or use train.resume=latest",
                )
            ]
        )
    return path


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: Path,
    state: TrainerState,
    keep_last: int,
    extra_artifacts: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint atomically on all ranks; prune to the newest `keep_last`. Call on EVERY rank.

    `extra_artifacts(tmp_dir)` runs on every rank before the rename (e.g. a task writes its LoRA adapter
    next to the resumable state), so it is published together with the checkpoint or not at all."""
    root = checkpoints_root(output_dir)
    final = root / f"step_{state.global_step}"
    staging = staging_dir(final)  # one name every rank agrees on: each writes its shard into it
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    if extra_artifacts is not None:
        extra_artifacts(staging)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state.world_size = accelerator.num_processes
        (staging / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        publish_dir(staging, final)
        for old in complete_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp_step_*"):  # left by saves killed before their rename
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def read_trainer_state(path: Path) -> TrainerState:
    """The loop position stored in a checkpoint (no tensors loaded)."""
    return TrainerState(**json.loads((Path(path) / STATE_FILE).read_text()))


def load_checkpoint(accelerator: Accelerator, path: Path) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states (collective) and return the loop position."""
    accelerator.load_state(str(path))
    return read_trainer_state(path)
