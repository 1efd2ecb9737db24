"""The permission bits of what framer_ds writes: those a plain `open()` / `mkdir()` would give under the
user's umask (files 0o666 & ~umask, directories 0o777 & ~umask), whatever library wrote them.

Why: some writers we call make their files private. safetensors (0.8) writes every `.safetensors` file
through a temporary file of its own, created 0600, and renames it; `tempfile.mkstemp` / `mkdtemp` give
0600 / 0700 and a rename keeps the mode. So `model.safetensors` in a checkpoint, `final/`'s adapter and
an export were readable by their owner only while the JSON beside them was 0644: on a shared cluster
the team, and a ComfyUI or inference server running as another user, could not read the weights.
The atomic writers (storage/atomic.py) call `give_default_mode(s)` on what they publish, before the
rename, so a file appears with its final mode.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_STATUS = Path("/proc/self/status")


def _umask_by_setting() -> int:
    """The umask read the only portable way: set it, then set it back.

    os.umask is process-wide, so a file another thread creates between the two calls gets the
    temporary umask; 0o077 makes such a file more private, never more open. Called once, at import:
    framer_ds imports its storage layer before it starts any thread of its own."""
    current = os.umask(0o077)
    os.umask(current)
    return current


def _umask_from_proc() -> int | None:
    """The umask as Linux reports it (`Umask:` in /proc/self/status, Linux >= 4.7): read without
    changing it, so it is safe from any thread and follows a umask changed after import."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


_UMASK_AT_IMPORT = _umask_from_proc()
if _UMASK_AT_IMPORT is None:
    _UMASK_AT_IMPORT = _umask_by_setting()


def process_umask() -> int:
    """The process's umask now where the system tells it without a change (Linux), else as at import."""
    current = _umask_from_proc()
    return _UMASK_AT_IMPORT if current is None else current


def default_file_mode() -> int:
    return 0o666 & ~process_umask()


def default_dir_mode() -> int:
    return 0o777 & ~process_umask()


def give_default_mode(path: Path, umask: int | None = None) -> None:
    """chmod one file or directory to the mode `open()` / `mkdir()` would have given it. A symlink is
    left alone (chmod would change its target); a file owned by another user (that we cannot chmod) too."""
    umask = process_umask() if umask is None else umask
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return
    wanted = (0o777 if stat.S_ISDIR(info.st_mode) else 0o666) & ~umask
    if stat.S_IMODE(info.st_mode) != wanted:
        with contextlib.suppress(PermissionError):
            os.chmod(path, wanted)


def give_default_modes(root: Path) -> None:
    """`give_default_mode` for `root` and everything under it (a staged directory before its rename)."""
    umask = process_umask()
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            give_default_mode(Path(directory) / name, umask)
    give_default_mode(Path(root), umask)
