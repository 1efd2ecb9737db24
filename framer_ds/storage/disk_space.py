"""A full disk reported as one line naming the place and the bytes needed, instead of a serializer's riddle.

Why: torch.save writes through its own C++ stream writer, which on ENOSPC raises
`RuntimeError: [enforce fail at inline_container.cc] . unexpected pos N vs M` (or "file write failed"),
not an OSError; a user cannot tell from it that the disk is full, nor how much space the write needs.
Writers wrap their work in `reporting_full_disk`: a write failure on a disk that is full becomes
`DiskFullError` (the CLI prints it and exits 1), after the partial output is deleted so the space it
took is free again and whatever was complete before stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# What torch's stream writer (torch.save, accelerate's save_state) says when a write comes up short.
SERIALIZER_WRITE_FAILURES = ("unexpected pos", "file write failed")
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NEARLY_FULL = 2**20  # bytes: a serializer failure with less free than this (or than needed) is "full"


class DiskFullError(RuntimeError):
    """A write ran out of disk space; the message names the place, the bytes needed and the fix."""


def tree_bytes(root: Path) -> int:
    """Bytes in the files under `root` (0 when it does not exist)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # a file removed while walking
                total += (Path(directory) / name).stat().st_size
    return total


def free_bytes(path: Path) -> int:
    """Bytes free for an unprivileged writer on the file system that holds `path` (or its nearest
    existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(exc: BaseException, where: Path, needed: int) -> bool:
    """Whether `exc` (or what it wraps) is a write that failed for lack of space under `where`: an
    OSError with ENOSPC/EDQUOT, or the serializer's short-write RuntimeError while the disk is full."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno in _NO_SPACE:
            return True
        if isinstance(cause, RuntimeError) and any(m in str(cause) for m in SERIALIZER_WRITE_FAILURES):
            return free_bytes(where) < max(needed, _NEARLY_FULL)
    return False


@contextlib.contextmanager
def reporting_full_disk(where: Path, needed: int, partial: Path, kept: str, fix: str) -> Iterator[None]:
    """Run a write of about `needed` bytes (0: unknown) into `partial` under `where`; when the disk
    fills, delete `partial` and raise DiskFullError: "no space left on WHERE: N bytes needed, F free;
    KEPT. FIX". Other failures pass through unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if not is_disk_full(exc, where, needed):
            raise
        written = tree_bytes(partial)
        shutil.rmtree(partial, ignore_errors=True)  # its space back; what was complete before is untouched
        amount = f"{needed} bytes needed" if needed >= written else f"at least {written} bytes needed"
        raise DiskFullError(
            f"no space left on {where}: {amount}, {free_bytes(where)} free; {kept}. {fix}"
        ) from None
