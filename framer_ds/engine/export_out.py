"""Where `framer-ds export ... --out DIR` writes: one rule for every format of every task.

**An export never deletes or replaces a file it did not write.** Before this rule the Wan `comfyui`
export published its folder with the directory-replacing writer, which renames an existing `--out`
aside and deletes it: a user who pointed `--out` at `ComfyUI/models/loras` lost every LoRA there.

- A **single-file format** (ComfyUI's LoRA file) is meant to go into a folder that holds other files
  (a loader's model folder), so it adds its one file beside them (`export_file`) and creates `--out`
  if needed. A file of the same name is refused unless `--overwrite` is given, which replaces that
  one file and nothing else.
- A **directory format** (a peft adapter, a merged diffusers pipeline, a Framer checkpoint) IS the
  folder that a loader reads (`from_pretrained(DIR)`), so `--out` must be new or empty
  (`export_directory`): files mixed into it would be loaded with it (a second adapter's config, an old
  pipeline's component), and writing into a fresh subfolder instead would print a path the user did
  not ask for. A non-empty `--out` is refused in one line before any work, and `--overwrite` is
  refused with them too: replacing a directory would delete files this export did not write.

Both build in a private staging entry beside the target (`storage.atomic.building_dir`, which also
removes what killed exports left) and publish with a rename that never replaces what appeared
meanwhile, so the export appears whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import building_dir, fsync_path, publish_dir
from framer_ds.storage.file_modes import give_default_mode


def _refuse(message: str, flag: str = "--out") -> ConfigError:
    return ConfigError([ConfigProblem(flag, message)], "export")


def check_export_directory(out: Path, overwrite: bool = False) -> None:
    """Refuse, before any work, what `export_directory` would refuse: a non-empty `out`, `--overwrite`."""
    out = Path(out)
    if overwrite:
        raise _refuse(
            "this format writes a directory, which an export never replaces (it would delete files the "
            f"export did not write): drop --overwrite and choose a new or empty --out, or delete {out} "
            "yourself first",
            "--overwrite",
        )
    if out.exists() and not out.is_dir():
        raise _refuse(f"{out} is a file; this format writes a directory: choose a new --out")
    if out.is_dir() and any(out.iterdir()):
        raise _refuse(
            f"{out} is not empty; this format writes a whole directory (what from_pretrained reads), so it "
            "needs a new or empty --out: choose one (nothing in it was touched)"
        )


@contextlib.contextmanager
def export_directory(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a private staging directory to fill; it becomes `out` (new or empty) when the body succeeds.

    A directory that appeared at `out` meanwhile wins: the staging is deleted and the export refused."""
    out = Path(out)
    check_export_directory(out, overwrite)
    with building_dir(out) as staging:
        yield staging
    if not publish_dir(staging, out, replace=False):
        raise _refuse(f"{out} appeared while writing; nothing in it was touched: choose a new --out")


def check_export_file(out: Path, name: str, overwrite: bool) -> Path:
    """Refuse, before any work, what `export_file` would refuse; returns the file's path."""
    out, target = Path(out), Path(out) / name
    if out.exists() and not out.is_dir():
        raise _refuse(f"{out} is a file; --out names the folder to write {name} into")
    if target.is_dir():
        raise _refuse(f"{target} is a directory; choose another --out")
    if target.exists() and not overwrite:
        raise _refuse(
            f"{target} exists; pass --overwrite to replace that file (the other files in {out} are never "
            "touched), or choose another --out"
        )
    return target


@contextlib.contextmanager
def export_file(out: Path, name: str, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary path to write; it becomes `out/name`, beside whatever else `out` holds.

    Without `overwrite` the file is published with a hard link, which fails where the name exists, so
    a file of that name that appeared meanwhile is never replaced either (a file system without hard
    links falls back to a check just before the rename)."""
    target = check_export_file(out, name, overwrite)
    created = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with building_dir(target) as staging:
            yield staging / name
        try:
            written = staging / name
            give_default_mode(written)
            fsync_path(written)
            _publish_file(written, target, overwrite)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        if created:  # a failed export leaves no --out folder it made (a full disk, an interrupt)
            with contextlib.suppress(OSError):
                target.parent.rmdir()
        raise
    fsync_path(target.parent)


def _publish_file(written: Path, target: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(written, target)
        return
    try:
        os.link(written, target)
    except FileExistsError:
        raise _refuse(f"{target} appeared while writing; it was not touched: pass --overwrite") from None
    except OSError:  # no hard links here (some FUSE, SMB or FAT mounts)
        if target.exists():
            raise _refuse(f"{target} appeared while writing; it was not touched: pass --overwrite") from None
        os.replace(written, target)
