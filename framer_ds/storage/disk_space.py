"""A full disk reported as one line naming the place and the bytes needed, instead of a serializer's riddle.

Why: torch.save writes through its own C++ stream writer, which on ENOSPC raises
`RuntimeError: [enforce fail at inline_container.cc] . unexpected pos N vs M` (or "file write failed"),
not an OSError; safetensors (Rust) raises `SafetensorError: ... IoError(Os { code: 28, kind:
StorageFull ... })` and libsndfile a bare "System error"; a user cannot tell from them that the disk is
full, nor how much space the write needs. Every writer of a run or a command (checkpoints, `final/`,
`best/`, samples, metrics.jsonl, eval.json, exports) wraps its work in `reporting_full_disk`: a write
failure on a disk that is full becomes `DiskFullError` (the CLI prints it and exits 1), after the
partial output is deleted so the space it took is free again and whatever was complete before stays
as it was. What no writer wraps still ends in one line: the CLI names the directory of a write that
failed with ENOSPC/EDQUOT (`full_disk_line`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# What torch's stream writer (torch.save, accelerate's save_state) says when a write comes up short, and
# libsndfile's message for any failed write (soundfile's LibsndfileError, a RuntimeError).
SERIALIZER_WRITE_FAILURES = ("unexpected pos", "file write failed", "System error")
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
# How ENOSPC/EDQUOT read in the text of an error that carries no errno: Rust's io::Error (safetensors:
# "No space left on device (os error 28)", or its Debug form "kind: StorageFull"), FFmpeg via PyAV.
_NO_SPACE_TEXT = (
    *(os.strerror(code) for code in sorted(_NO_SPACE)),
    *(f"os error {code}" for code in sorted(_NO_SPACE)),
    "StorageFull",
    "QuotaExceeded",
)
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


def _no_space_error(exc: BaseException) -> BaseException | None:
    """The error in `exc`'s chain that says ENOSPC/EDQUOT outright (an errno, or its text), if any."""
    for cause in _causes(exc):
        if isinstance(cause, DiskFullError):
            return cause
        if isinstance(cause, OSError) and cause.errno in _NO_SPACE:
            return cause
        if any(text in str(cause) for text in _NO_SPACE_TEXT):
            return cause
    return None


def is_disk_full(exc: BaseException, where: Path, needed: int) -> bool:
    """Whether `exc` (or what it wraps) is a write that failed for lack of space under `where`: ENOSPC or
    EDQUOT (an OSError, or the same in the text of a library's error), or a serializer's short-write
    RuntimeError while the disk is full."""
    if _no_space_error(exc) is not None:
        return True
    for cause in _causes(exc):
        if isinstance(cause, RuntimeError) and any(m in str(cause) for m in SERIALIZER_WRITE_FAILURES):
            return free_bytes(where) < max(needed, _NEARLY_FULL)
    return False


def full_disk_line(exc: BaseException) -> str | None:
    """One line for a write that failed with ENOSPC/EDQUOT where no writer said more (a small file
    written during start-up, a cache): the directory of the file when the error names it. None when
    `exc` is not a full disk."""
    cause = _no_space_error(exc)
    if cause is None:
        return None
    if isinstance(cause, DiskFullError):
        return str(cause)
    filename = getattr(cause, "filename", None)
    where = f"{Path(filename).parent} ({Path(filename).name})" if filename else "the disk being written"
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    return f"no space left on {where}: {reason}. Free space there and run the command again"


@contextlib.contextmanager
def reporting_full_disk(
    where: Path, needed: int, partial: Path | None, kept: str, fix: str
) -> Iterator[None]:
    """Run a write of about `needed` bytes (0: unknown) into `partial` (a directory or a file; None when
    the writer removes its own temporary output) under `where`; when the disk fills, delete `partial`
    and raise DiskFullError: "no space left on WHERE: N bytes needed, F free; KEPT. FIX". Other
    failures pass through unchanged."""
    try:
        yield
    except Exception as exc:  # any writer's error type: is_disk_full decides, the rest is re-raised
        if not is_disk_full(exc, where, needed):
            raise
        written = _remove_partial(partial)  # its space back; what was complete before is untouched
        if isinstance(exc, DiskFullError):  # an inner writer already said it
            raise
        raise DiskFullError(
            f"no space left on {where}: {_amount(needed, written, where)}; {kept}. {fix}"
        ) from None


def _amount(needed: int, written: int, where: Path) -> str:
    """ "N bytes needed, F free", "at least W bytes needed, F free" (the partial output was larger than
    the estimate), or "F bytes free" when neither is known."""
    free = free_bytes(where)
    if needed and needed >= written:
        return f"{needed} bytes needed, {free} free"
    if written:
        return f"at least {written} bytes needed, {free} free"
    return f"{free} bytes free"


def _remove_partial(partial: Path | None) -> int:
    """Delete a partial output (file or directory); returns the bytes it held."""
    if partial is None or not (partial.exists() or partial.is_symlink()):
        return 0
    if partial.is_dir() and not partial.is_symlink():
        written = tree_bytes(partial)
        shutil.rmtree(partial, ignore_errors=True)
        return written
    with contextlib.suppress(OSError):
        written = partial.stat().st_size
        partial.unlink()
        return written
    return 0
