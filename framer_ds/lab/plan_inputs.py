"""The measured inputs of `framer-ds plan` - the parameter census, the activation probes and what the task
assumed for them - and their cache under `$FRAMER_DS_CACHE/plan/`.

Why a cache: the probe runs the full-size model on fake tensors, seconds to tens of seconds of CPU for a
video UNet, and a user plans the same config again and again (other GPU counts, memories, global
batches: none of which changes these inputs). Each result is stored once, written atomically
(storage/atomic.py), under a key made of everything that can change it:

- the resolved config (every key but `output_dir`), so shapes, dtype, checkpointing, LoRA targets and
  rank, the base and its stand-in, the data options;
- what the files and folders the config names hold, up to two levels down (each entry's name, size and
  modification time; at most `WALK_LIMIT` entries a path): a base's config.json, a tokenizer, the clips
  a bucket plan reads;
- framer_ds's own code (a digest of every source file and shipped architecture, so an edited checkout
  never reads figures an older one measured), the versions of torch, diffusers, transformers, peft and
  accelerate, and the device the probe ran on (its kernels choose what attention saves).

A result that cannot be read (an older format, a truncated file) is measured again and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from framer_ds.lab.activation_probe import ActivationProbe
from framer_ds.lab.memory_model import ParameterCensus
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.storage.locations import default_cache_dir

if TYPE_CHECKING:
    from framer_ds.tasks.base import Task

CACHE_FORMAT = 1
WALK_LIMIT = 4096
"""Entries fingerprinted under one path the config names (a data folder of millions of images stops
there; its top level is always listed)."""
LIBRARIES = ("torch", "diffusers", "transformers", "peft", "accelerate")
PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PlanInputs:
    """What a plan measured: the census, the probes ("configured" and, when the config has gradient
    checkpointing off, "checkpointing") and the task's assumptions about files not on disk."""

    census: ParameterCensus
    probes: dict[str, ActivationProbe]
    assumptions: list[str]

    def as_dict(self) -> dict[str, Any]:
        census = asdict(self.census)
        census["auto_buffers"] = dict(self.census.auto_buffers)
        return {
            "census": census,
            "probes": {name: probe.as_dict() for name, probe in self.probes.items()},
            "assumptions": list(self.assumptions),
        }

    @classmethod
    def from_dict(cls, found: dict[str, Any]) -> PlanInputs:
        probes = {name: ActivationProbe.from_dict(probe) for name, probe in found["probes"].items()}
        return cls(ParameterCensus(**found["census"]), probes, list(found["assumptions"]))


def measure_inputs(task: Task, checkpointing_task: Callable[[], Task] | None) -> PlanInputs:
    """Census and probes of `task`; `checkpointing_task` builds the same config with gradient checkpointing
    switched on, probed too (its evaluation transient is the configured one's) when given."""
    from dataclasses import replace

    from framer_ds.lab.activations import probe_activations
    from framer_ds.lab.census import helper_modules, meta_model, task_census
    from framer_ds.tasks.planning import planning_hooks

    model = meta_model(task)  # one build for both: the census counts it before the probe fakes it
    helpers = helper_modules(task)
    census = task_census(task, model, helpers)
    probes = {"configured": probe_activations(task, model=model, helpers=helpers.in_evaluation)}
    if checkpointing_task is not None:
        probe = probe_activations(checkpointing_task(), with_eval=False)
        probes["checkpointing"] = replace(probe, eval_transient=probes["configured"].eval_transient)
    return PlanInputs(census, probes, planning_hooks(task).plan_assumptions())


@dataclass(frozen=True)
class CacheEntry:
    """Where a plan's inputs are cached, and whether this plan read them from there."""

    path: Path
    hit: bool


def cached_inputs(
    config: Any, measure: Callable[[], PlanInputs], cache_dir: Path | None = None, remeasure: bool = False
) -> tuple[PlanInputs, CacheEntry]:
    """The inputs for `config` from the cache, else `measure()`d and stored. `remeasure`: measure even
    when an entry exists (and replace it)."""
    path = (cache_dir or default_cache_dir()) / "plan" / f"{inputs_key(config)}.json"
    if not remeasure:
        try:
            stored = json.loads(path.read_text())
            if stored.get("format") == CACHE_FORMAT:
                return PlanInputs.from_dict(stored["inputs"]), CacheEntry(path, hit=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent, or unreadable: measured again below
    inputs = measure()
    atomic_write_json(path, {"format": CACHE_FORMAT, "inputs": inputs.as_dict()})
    return inputs, CacheEntry(path, hit=False)


def inputs_key(config: Any) -> str:
    """The hex digest every input of the measurement goes into (module docstring)."""
    dumped = config.model_dump(mode="json", exclude={"output_dir"})
    material = {
        "format": CACHE_FORMAT,
        "config": dumped,
        "files": {text: _fingerprint(Path(text)) for text in sorted(set(_path_leaves(dumped)))},
        "code": code_digest(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "device": _device(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _path_leaves(value: Any) -> Iterator[str]:
    """Every string in the dumped config that names something on disk."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _path_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _path_leaves(item)
    elif isinstance(value, str) and value and len(value) < 4096:
        try:
            if Path(value).exists():
                yield value
        except OSError:  # a string too long or odd for the file system is not a path
            return


def _fingerprint(path: Path) -> list:
    """(relative name, size, modification time) of `path` and what lies under it, two levels down, at
    most WALK_LIMIT entries (then a marker says the walk stopped)."""
    found: list = []
    level = [(path, "")]
    for _ in range(3):
        below = []
        for current, name in level:
            try:
                stat = current.stat()
            except OSError:
                continue
            found.append([name, stat.st_size, stat.st_mtime_ns])
            if current.is_dir() and len(found) < WALK_LIMIT:
                try:
                    children = sorted(os.listdir(current))
                except OSError:
                    continue
                below += [(current / child, f"{name}/{child}") for child in children]
            if len(found) >= WALK_LIMIT:
                return [*found, ["walk stopped", len(below), 0]]
        level = below
    return found


_CODE_DIGEST: list[str] = []


def code_digest() -> str:
    """A digest of framer_ds's sources and shipped architecture configs (computed once a process)."""
    if not _CODE_DIGEST:
        digest = hashlib.sha256()
        for file in sorted(PACKAGE.rglob("*")):
            if file.suffix in (".py", ".json") and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(PACKAGE)).encode())
                digest.update(file.read_bytes())
        _CODE_DIGEST.append(digest.hexdigest())
    return _CODE_DIGEST[0]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _device() -> str:
    """The device the probe's fake tensors are made on (lab/activations.py), with the GPU's name."""
    import torch

    return f"cuda {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "cpu"
