"""How a full disk is recognised and reported, without a full disk (the real ones are fault cases:
tests/faults/full_disk_cases.py): every writer's way of saying ENOSPC, a record appended whole or not
at all, and the CLI's one line for a write no writer wrapped."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from framer_ds.storage.disk_space import DiskFullError, full_disk_line, is_disk_full, reporting_full_disk
from framer_ds.storage.records import append_record


class SafetensorLikeError(Exception):
    """What safetensors' Rust writer raises (not an OSError, no errno)."""


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/model.safetensors"),
        OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
        SafetensorLikeError("Error while serializing: I/O error: No space left on device (os error 28)"),
        SafetensorLikeError('IoError(Os { code: 122, kind: QuotaExceeded, message: "Disk quota exceeded" })'),
    ],
    ids=["ENOSPC", "EDQUOT", "rust-display", "rust-debug"],
)
def test_every_way_of_saying_the_disk_is_full_is_recognised(error, tmp_path):
    assert is_disk_full(error, tmp_path, 0)
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = error
    assert is_disk_full(wrapped, tmp_path, 0)  # behind the writer's own error


def test_a_short_write_counts_only_on_a_full_disk(tmp_path):
    """torch's and libsndfile's short-write errors carry no errno: they are a full disk only when the
    disk is (nearly) full; here it is not, so they pass through as what they are."""
    for message in ("unexpected pos 123 vs 456", "Error : System error."):
        assert not is_disk_full(RuntimeError(message), tmp_path, 0)
    assert not is_disk_full(ValueError("bad value"), tmp_path, 0)


def test_a_full_disk_deletes_the_partial_output_and_says_so_in_one_line(tmp_path):
    partial = tmp_path / ".tmp_final"
    partial.mkdir()
    (partial / "half.safetensors").write_bytes(b"x" * 100)
    kept = tmp_path / "final"
    kept.mkdir()
    (kept / "old.safetensors").write_bytes(b"old")
    full = reporting_full_disk(tmp_path, 0, partial, kept="final/ is kept as it was", fix="Free space")
    with pytest.raises(DiskFullError) as info, full:
        raise SafetensorLikeError("I/O error: No space left on device (os error 28)")
    message = str(info.value)
    assert message.startswith(f"no space left on {tmp_path}: at least 100 bytes needed, ")
    assert message.endswith("; final/ is kept as it was. Free space") and "\n" not in message
    assert not partial.exists() and (kept / "old.safetensors").read_bytes() == b"old"


def test_other_failures_pass_through_and_keep_the_partial_output(tmp_path):
    partial = tmp_path / "partial.bin"
    partial.write_bytes(b"x")
    with pytest.raises(KeyError), reporting_full_disk(tmp_path, 0, partial, kept="", fix=""):
        raise KeyError("not a disk problem")
    assert partial.exists()


class FillsUp:
    """A file handle whose write stores half of what it is given, then fails as a full disk does."""

    def __init__(self, handle):
        self.handle, self.calls = handle, 0

    def fileno(self) -> int:
        return self.handle.fileno()

    def write(self, data) -> int:
        self.calls += 1
        if self.calls > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(bytes(data[: len(data) // 2]))


def test_a_record_is_appended_whole_or_not_at_all(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n')
    with path.open("ab", buffering=0) as handle:
        append_record(handle, b'{"step": 2}\n')
        with pytest.raises(OSError):
            append_record(FillsUp(handle), b'{"step": 3, "long": "' + b"x" * 64 + b'"}\n')
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n'  # no half of step 3


def test_the_cli_names_the_directory_of_a_write_no_writer_wrapped(tmp_path: Path):
    error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "run" / "config.yaml"))
    line = full_disk_line(error)
    assert line is not None and line.startswith(f"no space left on {tmp_path / 'run'} (config.yaml): ")
    assert full_disk_line(OSError(errno.EACCES, "Permission denied")) is None
    assert full_disk_line(DiskFullError("no space left on X: ...")) == "no space left on X: ..."
