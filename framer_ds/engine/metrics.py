"""metrics.jsonl (the run-directory contract) plus accelerate's trackers (W&B, TensorBoard).

Only the main process writes; every line is written through at once so a killed job keeps what it
logged, and whole or not at all, so a full disk leaves no half line (one DiskFullError instead).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from accelerate import Accelerator

from framer_ds.compat import require
from framer_ds.config.schema import RunConfigBase
from framer_ds.engine.tracker_media import TensorBoardMedia, wandb_media
from framer_ds.storage.disk_space import reporting_full_disk
from framer_ds.storage.records import append_record


class MetricsLogger:
    """Append-only JSON lines on rank 0, mirrored to accelerate's trackers."""

    def __init__(
        self, accelerator: Accelerator, config: RunConfigBase, summary: dict[str, Any], start_step: int
    ):
        self.accelerator = accelerator
        self.path = Path(config.output_dir) / "metrics.jsonl"
        self._file = None
        self._tensorboard_media: TensorBoardMedia | None = None  # built at the first media, main process
        if accelerator.is_main_process:
            self._file = self.path.open("ab", buffering=0)
            self._append({"step": start_step, "run_summary": summary})
        if accelerator.log_with:
            init_kwargs: dict[str, Any] = {}
            if config.log.wandb is not None:
                wandb = config.log.wandb
                init_kwargs["wandb"] = {
                    "dir": str(config.output_dir),
                    "mode": "offline" if wandb.offline else "online",
                    "name": wandb.run_name,
                    "entity": wandb.entity,
                }
            project = config.log.wandb.project if config.log.wandb else Path(config.output_dir).name
            tracked = {**config.model_dump(mode="json"), "run_summary": summary}
            accelerator.init_trackers(project, config=_flatten(tracked), init_kwargs=init_kwargs)

    def log(self, values: dict[str, float], step: int) -> None:
        if self._file is not None:
            # "time": wall clock (Unix seconds), so `framer-ds report` can give a run's time and a curve
            # over hours; only in this file, W&B and TensorBoard stamp their own.
            line = {
                "step": step,
                "time": round(time.time(), 3),
                **{k: _finite_or_str(v) for k, v in values.items()},
            }
            self._append(line)
        if self.accelerator.log_with:
            self.accelerator.log(values, step=step)

    def log_media(self, name: str, paths: list[Path], step: int) -> None:
        """Files written by a task (main process): listed in metrics.jsonl as paths relative to the run
        directory, and sent to each tracker as videos, audio or images by their suffix: W&B (offline
        mode too) and TensorBoard (`engine.tracker_media`)."""
        if not paths or not self.accelerator.is_main_process:
            return
        if self._file is not None:
            relative = [str(Path(p).relative_to(self.path.parent)) for p in paths]
            self._append({"step": step, f"media/{name}": relative})
        trackers = {t.name for t in self.accelerator.trackers} if self.accelerator.log_with else set()
        if "wandb" in trackers:
            wandb = require("wandb", "logging media to W&B (log.wandb)")
            media = [wandb_media(wandb, Path(p)) for p in paths]
            self.accelerator.get_tracker("wandb", unwrap=True).log({name: media}, step=step)
        if "tensorboard" in trackers:
            if self._tensorboard_media is None:
                writer = self.accelerator.get_tracker("tensorboard", unwrap=True)
                self._tensorboard_media = TensorBoardMedia(writer)
            self._tensorboard_media.log(name, [Path(p) for p in paths], step)

    def _append(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line) + "\n").encode()
        with reporting_full_disk(
            self.path.parent,
            len(data),
            None,
            kept=f"{self.path.name} is whole up to the line before (step {line['step']} was not logged)",
            fix="Free space there and resume with train.resume=latest",
        ):
            append_record(self._file, data)

    def close(self) -> None:
        """Close metrics.jsonl. Trackers are finished with the process group, once per run, by
        `engine.accelerator.end_accelerator`, which also runs when the logger was never built."""
        if self._file is not None:
            self._file.close()
            self._file = None


def last_logged(output_dir: Path, key: str, at_or_before: int) -> tuple[int, float] | None:
    """(step, value) of the last metrics.jsonl line with `key` at or before step `at_or_before`, or None
    (no file, no such line). For messages about a checkpoint ("loss 1.2e+07 at step 16"): the file holds
    only the current timeline (a resume drops the lines past its checkpoint, engine/run_dir.py)."""
    found = None
    try:
        lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            entry = json.loads(line)
            if key in entry and int(entry["step"]) <= at_or_before:
                found = (int(entry["step"]), float(entry[key]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill mid-write
    return found


MemoryProbe = Callable[[], dict[str, float]]
_MEMORY_PROBES: list[MemoryProbe] = []


def add_memory_probe(probe: MemoryProbe) -> None:
    """Add figures to every CPU metrics line's memory stats. Why a hook: on a CPU nothing in torch
    counts every allocation, so a measuring tool (the lab's preloaded allocation counter,
    `lab/alloc_counter.py`) brings its own figures; the engine knows no counter and binds no library."""
    _MEMORY_PROBES.append(probe)


def memory_stats() -> dict[str, float]:
    """GPU allocated/reserved, now and peak (GiB) on GPU; process RSS (GiB) on CPU, plus what each probe
    added with `add_memory_probe` reports (the lab's counter: `memory/max_allocated_gb`, every heap
    allocation and mapping, which RSS hides until touched, and `memory/max_tensor_allocated_gb`, tensor
    bytes alone, what a GPU's max_allocated means)."""
    if torch.cuda.is_available():
        return {
            "memory/allocated_gb": torch.cuda.memory_allocated() / 2**30,
            "memory/reserved_gb": torch.cuda.memory_reserved() / 2**30,
            "memory/max_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
            "memory/max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
        }
    stats = {"memory/rss_gb": _this_process().memory_info().rss / 2**30}
    for probe in _MEMORY_PROBES:
        stats.update(probe())
    return stats


@functools.cache
def _this_process() -> psutil.Process:
    """Built once: constructing psutil.Process costs ~50 us, a noticeable share of a small step."""
    return psutil.Process(os.getpid())


def _finite_or_str(value: float) -> float | str:
    """JSON has no NaN/inf: write them as strings so the line stays parseable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat
