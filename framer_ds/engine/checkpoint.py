"""Resumable checkpoints: atomic writes with a manifest, keep-last-K, and choosing the one to resume.

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
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.loader import dump_run_config
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.manifest import Verification, verify_checkpoint, write_manifest
from framer_ds.engine.rank_zero import decided_by_rank_zero
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
    # The best evaluation so far (train.best_metric), so a resumed run replaces best/ only with a better
    # model. Checkpoints written before these fields existed load with them unset.
    best_metric: str | None = None  # the metric and mode the value was judged by: another one on resume
    best_mode: str | None = None  # makes the stored value meaningless, and it is forgotten
    best_value: float | None = None
    best_step: int | None = None

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


@dataclass
class ResumeChoice:
    """The checkpoint a run continues from, and what the choice had to say about the others."""

    path: Path | None
    notes: list[str]


def verified(path: Path) -> Verification:
    """The manifest check plus a readable trainer_state.json (what the loop reads first)."""
    result = verify_checkpoint(path)
    if result.ok:
        try:
            read_trainer_state(path)
        except (OSError, ValueError, TypeError) as exc:
            result.problems.append(f"{path / STATE_FILE} is unreadable ({exc})")
    return result


def choose_resume(output_dir: Path, resume: str | None) -> ResumeChoice:
    """`null` -> None; `latest` -> the newest checkpoint that verifies (each one skipped is named with
    its reason; None when there is none at all); a path -> that checkpoint, which must verify.
    Reads every file of the chosen checkpoint once (sha256): run it on one process."""
    if resume is None:
        return ResumeChoice(None, [])
    if resume != "latest":
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            raise ConfigError(
                [
                    ConfigProblem(
                        "train.resume",
                        f"{path} is not a complete framer_ds checkpoint (no {STATE_FILE}); point it at "
                        "output_dir/checkpoints/step_N or use train.resume=latest",
                    )
                ]
            )
        check = verified(path)
        if not check.ok:
            fix = "resume from another checkpoint (train.resume=latest picks the newest that verifies)"
            raise ConfigError([ConfigProblem("train.resume", f"{p}; {fix}") for p in check.problems])
        return ResumeChoice(path, check.warnings)
    notes: list[str] = []
    candidates = complete_checkpoints(output_dir)
    for path in reversed(candidates):
        check = verified(path)
        if check.ok:
            return ResumeChoice(path, [*notes, *check.warnings])
        notes.append(f"skipped {path.name}: " + "; ".join(check.problems))
    if candidates:
        raise ConfigError(
            [ConfigProblem("train.resume", note) for note in notes]
            + [
                ConfigProblem(
                    "train.resume",
                    f"none of the {len(candidates)} checkpoints in {checkpoints_root(output_dir)} verifies; "
                    "restore one from a copy, or start again with --overwrite",
                )
            ]
        )
    return ResumeChoice(None, notes)


def decide_resume(accelerator: Accelerator, output_dir: Path, resume: str | None) -> Path | None:
    """Rank 0 chooses (and verifies) the checkpoint and every rank gets its choice: ranks deciding on
    their own could pick different checkpoints when their views of the directory differ. Every rank."""

    def choose() -> str | None:
        picked = choose_resume(output_dir, resume)
        for note in picked.notes:
            print(f"resume: {note}", flush=True)
        return str(picked.path) if picked.path is not None else None

    chosen = decided_by_rank_zero(accelerator, choose)
    return Path(chosen) if chosen is not None else None


def save_checkpoint(
    accelerator: Accelerator,
    config: RunConfigBase,
    state: TrainerState,
    extra_artifacts: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint atomically on all ranks; prune to the newest `train.keep_last_checkpoints`.
    Call on EVERY rank.

    `extra_artifacts(tmp_dir)` runs on every rank before the rename (e.g. a task writes its LoRA adapter
    next to the resumable state), so it is published together with the checkpoint or not at all. The
    resolved config (what a resume compares against) and the manifest (written last) go in too."""
    output_dir, keep_last = Path(config.output_dir), config.train.keep_last_checkpoints
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
        (staging / CHECKPOINT_CONFIG).write_text(dump_run_config(config))
        plugin = accelerator.state.deepspeed_plugin
        if plugin is not None:
            ran = json.dumps(plugin.deepspeed_config, indent=2, default=str)
            (staging / DEEPSPEED_CONFIG).write_text(ran + "\n")
        write_manifest(staging)
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
