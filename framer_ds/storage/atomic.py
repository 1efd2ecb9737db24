"""Atomic, durable writes of files and directories: build beside the target, fsync, rename.

Why one helper for every writer (run directories, checkpoints, exports, caches): a job killed by
SIGKILL, the OOM killer or a lost node must leave the old content or the new, never half of either;
and after a power loss a rename is durable only once the data it points at and the directory that
holds it are fsynced. Each writer hand-rolling "temp + os.replace" got one of these wrong somewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from framer_ds.storage.file_modes import give_default_mode, give_default_modes

# The host goes into private staging names so that a process cleaning up after killed builders only
# judges processes of its own host (a directory on a shared file system may be staged from any node).
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _unique_suffix() -> str:
    return f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_staging(target: Path) -> list[Path]:
    """Delete the private staging directories of `target` left by builders of this host that were
    killed (SIGKILL, the OOM killer) before they could clean up; returns what was removed.

    Why: each is as large as what it was building (a merged video pipeline is gigabytes), and nothing
    else ever removes them. A staging directory whose process is alive, or that was made on another
    host, is left alone: it may be a concurrent builder."""
    target = Path(target)
    pattern = re.compile(rf"^\.tmp_{re.escape(target.name)}\.{re.escape(_HOST)}\.(\d+)\.[0-9a-f]{{8}}$")
    removed = []
    if not target.parent.is_dir():
        return removed
    for entry in target.parent.iterdir():
        match = pattern.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and not _process_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def fsync_path(path: Path) -> None:
    """Flush one file's data, or one directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (bottom-up), before a rename publishes it."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; on success it replaces `path` durably.

    The temporary name keeps `path`'s suffix, so writers that pick a format from the extension (PyAV's
    `.mp4`, safetensors) work unchanged. On an exception the temporary file is removed and `path` is
    untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{_unique_suffix()}.tmp{path.suffix}")
    try:
        yield tmp
        give_default_mode(tmp)  # the umask's mode, whatever the writer gave it (storage/file_modes.py)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def staging_dir(target: Path, *, unique: bool = False) -> Path:
    """Where `target` is built before `publish_dir`: beside it, so the rename never crosses file systems.

    The name is deterministic by default, because every rank of a job writes its shard into the same
    directory; `unique=True` is for builders that may race each other (several jobs filling one cache).
    """
    target = Path(target)
    name = f".tmp_{target.name}" + (f".{_unique_suffix()}" if unique else "")
    return target.with_name(name)


def publish_dir(staging: Path, target: Path, *, replace: bool = True) -> bool:
    """Move the finished `staging` directory to `target`; returns whether it is now in place.

    Everything under `staging` is fsynced first. `replace=True`: an existing `target` is renamed aside,
    the new one renamed in, and only then the old one deleted, so one complete copy exists at every
    instant. `replace=False` (a cache several processes may build at once): an existing non-empty
    `target` wins the race, `staging` is deleted and False is returned; the caller checks the winner.
    """
    staging, target = Path(staging), Path(target)
    give_default_modes(staging)  # the umask's modes, whatever the writers gave (storage/file_modes.py)
    fsync_tree(staging)
    if replace:
        if target.exists():
            os.replace(target, target.with_name(f".old_{target.name}.{_unique_suffix()}"))
        os.replace(staging, target)
        fsync_path(target.parent)
        # This copy's old version, and one left by a crash between the two renames of an earlier publish.
        for aside in target.parent.glob(f".old_{target.name}.*"):
            shutil.rmtree(aside, ignore_errors=True)
        return True
    try:
        os.replace(staging, target)  # onto an absent or empty directory
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    fsync_path(target.parent)
    return True


@contextlib.contextmanager
def building_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh private staging directory for `target` (one process); removed if the body fails.

    The caller publishes it with `publish_dir` (whose return value tells a lost race apart). Staging
    directories of `target` left by killed builders are removed first (`remove_stale_staging`)."""
    remove_stale_staging(target)
    staging = staging_dir(target, unique=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_once(path: Path, marker: str, build: Callable[[Path], None], what: str) -> Path:
    """A cached directory built by `build(staging)` exactly once: a finished one carries `marker` and is
    returned as is; a crash or a concurrent builder (test workers, ranks of several nodes) never leaves
    a half-written one, and a lost race is fine when the winner finished."""
    path = Path(path)
    if (path / marker).is_file():
        return path
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists but is not a finished {what}; remove it")
    with building_dir(path) as staging:
        build(staging)
        (staging / marker).write_text("complete\n")
    if not publish_dir(staging, path, replace=False) and not (path / marker).is_file():
        raise FileExistsError(f"{path} exists but is not a finished {what}; remove it")
    return path
