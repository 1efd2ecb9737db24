"""The one atomic-write helper: a failure or a crash at any point leaves a complete old or new copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from framer_ds.storage import atomic
from framer_ds.storage.atomic import (
    atomic_file,
    atomic_write_json,
    atomic_write_text,
    building_dir,
    publish_dir,
    staging_dir,
)
from framer_ds.storage.locations import default_cache_dir


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FRAMER_DS_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FRAMER_DS_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "framer_ds"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "metrics.jsonl"
    atomic_write_text(target, "old\n")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_the_temp_name_keeps_the_suffix_and_the_data_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced: list[Path] = []
    real_fsync = atomic.fsync_path
    monkeypatch.setattr(atomic, "fsync_path", lambda p: (synced.append(Path(p)), real_fsync(p)))
    with atomic_file(tmp_path / "clip.mp4") as tmp:
        assert tmp.suffix == ".mp4" and tmp.parent == tmp_path
        tmp.write_bytes(b"x")
    assert synced == [tmp, tmp_path]  # the file before the rename, the directory after
    atomic_write_json(tmp_path / "a.json", {"k": 1})
    assert (tmp_path / "a.json").read_text() == '{\n  "k": 1\n}\n'


def test_replacing_a_directory_never_leaves_neither(tmp_path, monkeypatch):
    """A crash between moving the old copy aside and moving the new one in leaves the old one on disk
    (renamed aside), not deleted: the old code removed `final/` before the new one was in place."""
    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_text("old")
    staging = staging_dir(final)
    staging.mkdir()
    (staging / "model.safetensors").write_text("new")

    real_replace = os.replace
    calls = []

    def crash_on_second_rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise OSError("node lost power")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", crash_on_second_rename)
    with pytest.raises(OSError):
        publish_dir(staging, final)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".old_final")]
    assert len(kept) == 1 and (kept[0] / "model.safetensors").read_text() == "old"
    assert (staging / "model.safetensors").read_text() == "new"

    monkeypatch.setattr(atomic.os, "replace", real_replace)
    (kept[0]).rename(final)
    assert publish_dir(staging, final)  # replaced: the new copy in, the old one gone
    assert (final / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_a_builder_that_loses_the_race_keeps_the_winner(tmp_path):
    target = tmp_path / "cache"
    with building_dir(target) as first:
        (first / "who").write_text("first")
    with building_dir(target) as second:
        (second / "who").write_text("second")
    assert publish_dir(first, target, replace=False)
    assert not publish_dir(second, target, replace=False)
    assert (target / "who").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_a_failed_build_leaves_nothing(tmp_path):
    with pytest.raises(ValueError), building_dir(tmp_path / "cache") as staging:
        (staging / "half").write_text("x")
        raise ValueError("render failed")
    assert list(tmp_path.iterdir()) == []


def _builder(target: Path, then: str) -> subprocess.Popen:
    """A process that stages `target` with building_dir and then runs `then` (a kill, or a wait)."""
    code = (
        "import os, signal, sys, time\n"
        "from framer_ds.storage.atomic import building_dir\n"
        f"with building_dir({str(target)!r}) as staging:\n"
        "    (staging / 'half').write_bytes(b'x' * 1000)\n"
        "    print(staging.name, flush=True)\n"
        f"    {then}\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_staging_left_by_a_killed_builder_is_removed_by_the_next_one(tmp_path):
    """A builder killed by SIGKILL cannot clean up; the next build of the same target removes what it
    left, but never the staging of a builder that is still running."""
    target = tmp_path / "merged"
    killed = _builder(target, "os.kill(os.getpid(), signal.SIGKILL)")
    killed_name = killed.stdout.readline().strip()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert (tmp_path / killed_name).is_dir()
    running = _builder(target, "time.sleep(60)")
    running_name = running.stdout.readline().strip()
    try:
        with building_dir(target) as staging:
            (staging / "weights").write_text("complete")
        assert publish_dir(staging, target, replace=False)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["merged", running_name]), left
    finally:
        running.kill()
        running.wait()
