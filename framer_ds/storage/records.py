"""Appending a record (a line of metrics.jsonl) whole or not at all.

Why: a line-buffered text file that hits a full disk can keep half a line (the kernel took part of the
write) and then raise again when it is closed (its buffer still holds the rest), replacing the one-line
error with a second traceback. An unbuffered append that cuts the file back to where it started on a
failed write leaves every line whole, so the file stays readable by `framer-ds report` and the resume
that rewrites it.
"""

from __future__ import annotations

import os
from typing import BinaryIO


def append_record(handle: BinaryIO, data: bytes) -> None:
    """Append `data` to `handle` (opened "ab" with buffering=0) completely, or leave the file as it was
    and raise. A short write is continued; any failure cuts the file back to its size before."""
    fd = handle.fileno()
    start = os.fstat(fd).st_size  # the file is opened for appending: every write lands at its end
    view = memoryview(data)
    try:
        while view:
            written = handle.write(view)
            view = view[written or 0 :]
    except BaseException:
        os.ftruncate(fd, start)
        raise
