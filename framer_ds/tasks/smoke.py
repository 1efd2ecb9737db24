"""What `framer-ds smoke` asks of a task: stand-ins for what a shipped recipe points at that cannot run on
this machine, and the arguments of its `framer-ds sample`.

Why a hook per task: only the task knows its bases' architectures (which config.json fields are width and
depth, which are the architecture), its data layout (a video folder with captions, an ImageFolder, a
Parquet of SNAC codes, a multi-camera manifest) and what its sampler takes. The smoke (lab/smoke.py)
keeps everything else of the recipe - the task, the architecture of each base, the data layout and
shapes, sequence length, vocabulary, LoRA targets, precision, the strategy - and swaps only these:

- a base's weights: a width- and depth-tiny random model of the same architecture, built from the
  config.json files of the directory the recipe names when it is on disk, else from the ones framer_ds
  ships for it (framer_ds/config/architectures, via the recipe's `architectures:` map), saved with
  `save_pretrained` under $FRAMER_DS_CACHE/smoke/ and loaded from there with `from_pretrained`;
- a data folder that is not on disk: synthetic data in the recipe's own layout and shapes;
- a shape this machine cannot run in minutes at any width (a video's frame count): the largest that
  does, named in `shrunk`, never silently.

A task that declares no hooks (`SmokeHooks` not among its bases) is smoked as it is: its own pre-flight
says what is missing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from framer_ds.config.architectures import shipped_architecture

if TYPE_CHECKING:
    from framer_ds.tasks.base import Task

SMOKE_FORMAT = 1
"""Part of every stand-in's cache key: bump it when a builder changes what it writes."""


@dataclass
class SmokeStandIns:
    """What the smoke changes in a recipe: dotted overrides, and one line per change saying what and why
    (`swapped`: weights and data that are not here; `shrunk`: shapes this machine cannot run)."""

    overrides: list[str] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)
    shrunk: list[str] = field(default_factory=list)

    def add(self, other: SmokeStandIns) -> None:
        self.overrides += other.overrides
        self.swapped += other.swapped
        self.shrunk += other.shrunk


class SmokeHooks:
    """Mixin for a task (`class MyTask(MySmoke, PlanningHooks, Task)`): the stand-ins and the sample
    arguments `framer-ds smoke` uses; the defaults swap nothing and sample nothing."""

    smoke_samples: ClassVar[bool] = False
    """Whether the smoke has a `sample` phase (`smoke_sample_args`): a task whose `framer-ds sample`
    needs inputs the smoke can make (a video task's first frame)."""

    def smoke_stand_ins(self, root: Path) -> SmokeStandIns:
        """Build (once, under `root`) what the recipe's config points at and cannot run here, and say so.
        Called on the task built from the recipe as shipped (plus the user's overrides)."""
        return SmokeStandIns()

    def smoke_sample_args(self, export_dir: Path, work: Path) -> list[str]:
        """The options of `framer-ds sample EXPORT_DIR ...` at the recipe's own sampling settings (inputs
        and the output under `work`), when `smoke_samples`. Called on the task built from the config
        the smoke trained."""
        return []

    def smoke_export_args(self, export_dir: Path, work: Path) -> list[str]:
        """The options of `framer-ds export EXPORT_DIR ...` in the task's main format (writing under
        `work`); none for a task without export formats (its `export` prints how to use final/)."""
        return []


def smoke_hooks(task: Task) -> SmokeHooks:
    """The task's own hooks where it declares them, else the defaults."""
    return task if isinstance(task, SmokeHooks) else SmokeHooks()


def stand_in_dir(root: Path, kind: str, key: dict[str, Any]) -> Path:
    """`root/kind/<hash>`: one folder per distinct stand-in (its architecture files and shrink rule, its
    data shapes), so two recipes that need the same one share it and a changed recipe gets its own."""
    text = json.dumps({"format": SMOKE_FORMAT, **key}, sort_keys=True, default=str)
    return Path(root) / kind / hashlib.sha256(text.encode()).hexdigest()[:16]


def architecture_source(config: Any, value: str | Path) -> tuple[Path, str] | None:
    """Where a base's config.json files are, and what to call it: the directory itself when it is on disk
    (its own architecture), else the folder framer_ds ships for the repo the recipe maps it to (or names
    directly); None when neither exists."""
    path = Path(value)
    if path.is_dir() and any(path.rglob("config.json")):
        return path, str(path)
    repo = config.architectures.get(str(value), str(value))
    folder = shipped_architecture(repo)
    return (folder, repo) if folder is not None else None


def read_config(folder: Path, subfolder: str | None = None, name: str = "config.json") -> dict[str, Any]:
    """A component's config.json as a dict (keys starting with '_' dropped: diffusers' bookkeeping)."""
    path = folder / subfolder / name if subfolder else folder / name
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def tiny_note(key: str, value: Any, name: str, folder: Path, what: str) -> str:
    """The line saying a base's weights were swapped for a tiny random model of its architecture."""
    return (
        f"{key}: {value} -> {folder} (a width- and depth-tiny random {what} of {name}'s architecture; "
        "its weights are not used)"
    )
