"""The run directory: refuse to clobber an existing run, write the resolved config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.config.loader import dump_run_config
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.checkpoint import complete_checkpoints
from framer_ds.storage.atomic import atomic_write_text

RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "final", "samples")


def holds_run(output_dir: Path) -> bool:
    return any((Path(output_dir) / name).exists() for name in RUN_MARKERS)


def check_run_dir(config: RunConfigBase) -> None:
    """Fail before any work when a fresh run would overwrite an existing one. Runs on every rank,
    before any rank writes, so no rank sees another's files."""
    if (
        config.train.resume == "latest"
        and holds_run(config.output_dir)
        and not complete_checkpoints(config.output_dir)
    ):
        raise ConfigError(
            [
                ConfigProblem(
                    "train.resume",
                    f"{config.output_dir} holds a run but no complete checkpoint under checkpoints/, so "
                    "there is nothing to resume. Set train.checkpoint_every for future runs; to start "
                    "this one again use --overwrite (overwrite_output_dir=true) without train.resume.",
                )
            ]
        )
    if config.train.resume is None and not config.overwrite_output_dir and holds_run(config.output_dir):
        raise ConfigError(
            [
                ConfigProblem(
                    "output_dir",
                    f"{config.output_dir} already holds a run. Continue it with train.resume=latest, "
                    "start over with overwrite_output_dir=true (deletes its checkpoints and metrics), "
                    "or choose another output_dir.",
                )
            ]
        )


def prepare_run_dir(accelerator: Accelerator, config: RunConfigBase, resume_step: int | None) -> None:
    """Create output_dir and write config.yaml (rank 0); on resume drop metric lines past the checkpoint."""
    out = Path(config.output_dir)
    if accelerator.is_main_process:
        if config.overwrite_output_dir:
            for name in RUN_MARKERS:
                target = out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.yaml", dump_run_config(config))
        metrics = out / "metrics.jsonl"
        if metrics.exists():
            truncate_metrics_after(metrics, resume_step or 0)
        drop_samples_after(out / "samples", resume_step or 0)
    accelerator.wait_for_everyone()


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
