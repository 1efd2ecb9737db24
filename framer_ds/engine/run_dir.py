"""The run directory: one writer at a time, seen by every rank, never clobbered by accident, and kept on
one timeline when a run resumes from an older checkpoint."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError
from framer_ds.config.loader import dump_run_config
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.best import BEST_DIR, read_best_record
from framer_ds.engine.checkpoint import checkpoints_root, complete_checkpoints, step_of
from framer_ds.engine.rank_zero import decided_by_rank_zero
from framer_ds.engine.run_lock import LOCK_NAME, RunLock
from framer_ds.storage.atomic import atomic_write_text

RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "final", "samples")
SHARED_MARKER = ".framer_ds_run_id"
ABANDONED_DIR = "abandoned"


def holds_run(output_dir: Path) -> bool:
    return any((Path(output_dir) / name).exists() for name in RUN_MARKERS)


def check_run_dir(config: RunConfigBase) -> None:
    """Fail before any work when a fresh run would overwrite an existing one. Runs on every rank,
    before any rank writes, so no rank sees another's files."""
    out = Path(config.output_dir)
    check_writable_dir(out)
    if config.train.resume == "latest" and (out / "final").exists() and not complete_checkpoints(out):
        raise ConfigError(
            [
                ConfigProblem(
                    "train.resume",
                    f"{out} holds a finished run (final/) without a checkpoint, so there is nothing to "
                    "resume. Start it again with --overwrite (overwrite_output_dir=true) without "
                    "train.resume, or choose another output_dir.",
                )
            ]
        )
    if config.train.resume is None and not config.overwrite_output_dir and holds_run(out):
        raise ConfigError(
            [
                ConfigProblem(
                    "output_dir",
                    f"{out} already holds a run. Continue it with train.resume=latest, start over with "
                    "overwrite_output_dir=true (deletes its checkpoints and metrics), or choose another "
                    "output_dir.",
                )
            ]
        )


def check_writable_dir(out: Path) -> None:
    """`out` exists (it is created) and takes a file, or RunSetupError names why not: a dangling symlink,
    a read-only file system, no permission, a full disk. Without this the first write (the run lock)
    failed with a bare FileExistsError or OSError traceback. Every rank may run it at once."""
    if out.is_symlink() and not out.exists():
        raise RunSetupError(
            f"output_dir {out} is a symlink to {os.readlink(out)}, which does not exist: create that "
            "directory (e.g. mount the disk it lives on) or set output_dir to a real directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".framer_ds_write_test."):
            pass
    except OSError as exc:
        at = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else ""
        raise RunSetupError(
            f"output_dir {out} cannot be written: {exc.strerror or exc}{at}; set output_dir to a directory "
            "on a writable file system with free space"
        ) from None


def claim_run_dir(accelerator: Accelerator, output_dir: Path) -> RunLock | None:
    """Rank 0 takes the run directory's lock (RunLock) and every rank learns whether it got it; a second
    run on the same directory fails here on every rank, naming the holder. Returns rank 0's lock."""

    def take() -> bool:
        lock = RunLock(output_dir)
        lock.acquire()
        held.append(lock)
        return True

    held: list[RunLock] = []
    decided_by_rank_zero(accelerator, take)
    return held[0] if held else None


def check_shared_run_dir(accelerator: Accelerator, output_dir: Path) -> None:
    """Every rank must see the files rank 0 writes: rank 0 writes a fresh token, every rank reads it.
    Without a shared file system checkpoints would be published half on each node (their shards in
    node-local `.tmp_step_*` never renamed), and each node would resume from its own idea of `latest`."""
    if accelerator.num_processes == 1:
        return
    marker = Path(output_dir) / SHARED_MARKER
    token = [secrets.token_hex(16) if accelerator.is_main_process else None]
    if accelerator.is_main_process:
        atomic_write_text(marker, token[0])
    broadcast_object_list(token, from_process=0)
    try:
        seen = marker.read_text() == token[0]
    except OSError:
        seen = False
    blind = [rank for rank, ok in enumerate(gather_object([seen])) if not ok]
    if blind:
        raise RunSetupError(
            f"ranks {blind} do not see {output_dir} as rank 0 wrote it: output_dir must be on a file system "
            "every node shares (NFS, Lustre, GPFS), e.g. /shared/runs/NAME, not a node-local disk."
        )


def prepare_run_dir(accelerator: Accelerator, config: RunConfigBase, resume_step: int | None) -> None:
    """On rank 0, with the lock held: clear the directory for --overwrite; on resume put the timeline
    the run leaves aside and drop metric lines and samples past the resume step. config.yaml is written
    later (`write_run_config`), once the run really starts."""
    out = Path(config.output_dir)
    if accelerator.is_main_process:
        if config.overwrite_output_dir:
            clear_run_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        step = resume_step or 0
        if config.train.resume is not None:
            if resume_step is None and holds_run(out):
                print(
                    f"resume: no checkpoint in {checkpoints_root(out)}: starting from step 0 (the directory "
                    "keeps its config; metric lines and samples of the interrupted attempt are dropped)",
                    flush=True,
                )
            for moved in set_aside_newer(out, step):
                print(f"resume: {moved.parent.name}/{moved.name} holds the abandoned timeline", flush=True)
        metrics = out / "metrics.jsonl"
        if metrics.exists():
            truncate_metrics_after(metrics, step)
        drop_samples_after(out / "samples", step)
    accelerator.wait_for_everyone()


def write_run_config(config: RunConfigBase) -> None:
    """`output_dir/config.yaml`, the config that runs: written (rank 0) once the model, data and
    checkpoint are loaded, not when the directory is prepared. A config error found in between (a
    training set smaller than a batch) used to leave a config.yaml behind, and the corrected rerun was
    refused as "already holds a run"."""
    atomic_write_text(Path(config.output_dir) / "config.yaml", dump_run_config(config))


def clear_run_dir(out: Path) -> None:
    """Everything of the old run goes (tensorboard/, wandb/, preempted.json too, whose old curves and
    markers would otherwise show in the new run); only the lock the new run holds stays."""
    if not out.is_dir():
        return
    for entry in out.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def set_aside_newer(out: Path, step: int) -> list[Path]:
    """Resuming from step N while later checkpoints exist starts a new timeline: the later ones (and a
    final/ exported from them, and a best/ exported after step N) move to
    `checkpoints/abandoned/<time>_from_step_N/`. Left in place they would be what `latest` picks after
    the next preemption, and keep-last-K pruning, which keeps the highest step numbers, would delete the
    NEW checkpoints in their favour; a stale best/ would stand for a model this timeline never had."""
    root = checkpoints_root(out)
    newer = [path for path in complete_checkpoints(out) if step_of(path) > step]
    if (out / "final").is_dir() and newer:
        newer.append(out / "final")
    if _best_step(out) > step:  # best/ exported after the resume point belongs to the abandoned timeline
        newer.append(out / BEST_DIR)
    if not newer:
        return []
    destination = root / ABANDONED_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}_from_step_{step}"
    destination.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in newer:
        os.replace(path, destination / path.name)
        moved.append(destination / path.name)
    return moved


def _best_step(out: Path) -> int:
    """The step `best/` was exported at (train.eval.best_metric), or -1 when there is none."""
    record = read_best_record(out)
    return record.step if record is not None else -1


def drop_samples_after(samples_dir: Path, step: int) -> None:
    """`samples/step_N` past the checkpoint belong to the abandoned timeline; the resumed run
    writes its own (metrics.jsonl loses their `media/samples` lines the same way)."""
    for folder in Path(samples_dir).glob("step_*"):
        suffix = folder.name.removeprefix("step_")
        if suffix.isdigit() and int(suffix) > step:
            shutil.rmtree(folder)


def truncate_metrics_after(path: Path, step: int) -> None:
    """Lines logged after the checkpoint we resume from would be duplicated by the resumed run.
    Rewritten atomically: a kill during the rewrite keeps the whole history."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))
