"""The run-directory lock: flock where it works, a heartbeat file where it does not (some Lustre/NFS)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from framer_ds.engine import run_lock
from framer_ds.engine.run_lock import LOCK_NAME, RunDirLocked, RunLock


def test_flock_refuses_a_second_holder_and_frees_on_release(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    assert first.mode == "flock"
    with pytest.raises(RunDirLocked, match=r"in use by pid \d+ on host"):
        RunLock(tmp_path).acquire()
    first.release()
    again = RunLock(tmp_path)
    again.acquire()  # released: the file stays, the lock does not
    again.release()


@pytest.fixture
def no_flock(monkeypatch):
    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", flock)


def test_without_flock_a_heartbeat_file_is_the_lock(tmp_path, no_flock):
    first = RunLock(tmp_path, heartbeat_s=0.1, stale_after_s=5)
    first.acquire()
    assert first.mode == "heartbeat"
    started = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
    time.sleep(0.4)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"] > started  # refreshed
    with pytest.raises(RunDirLocked, match=r"in use by pid"):
        RunLock(tmp_path, heartbeat_s=0.1, stale_after_s=5).acquire()
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize(
    ("host", "pid", "age_s"),
    [("another-node", 12345, 600.0), (socket.gethostname(), 2**22 + 17, 0.0)],
    ids=["stale heartbeat on another node", "dead pid on this host"],
)
def test_a_stale_heartbeat_lock_is_taken_over(tmp_path, no_flock, host, pid, age_s):
    now = time.time()
    (tmp_path / LOCK_NAME).write_text(
        json.dumps({"host": host, "pid": pid, "started": now - age_s, "heartbeat": now - age_s, "token": "t"})
    )
    lock = RunLock(tmp_path, heartbeat_s=0.1, stale_after_s=60)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == lock._me.pid
    lock.release()


def test_a_live_heartbeat_on_another_node_is_respected(tmp_path, no_flock):
    now = time.time()
    holder = {"host": "node-17", "pid": 4242, "started": now - 100, "heartbeat": now - 5, "token": "t"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
    with pytest.raises(RunDirLocked, match="pid 4242 on host node-17"):
        RunLock(tmp_path, stale_after_s=60).acquire()


def _contend(run_dir: Path, start: Any, delay_s: float, results: Any, release: Any) -> None:
    """One newcomer in a process of its own, on a file system without flock: wait for the start, take
    the lock or fail, report, and keep a won lock until the test has every answer."""

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    def slow_read_holder(path: Path, read=run_lock._read_holder):
        holder = read(path)
        time.sleep(0.05)  # a shared file system answers late: the holder may have changed by now
        return holder

    run_lock.fcntl.flock = flock
    run_lock._read_holder = slow_read_holder
    lock = RunLock(run_dir, heartbeat_s=0.1, stale_after_s=60)
    start.wait()
    time.sleep(delay_s)
    try:
        lock.acquire()
    except RunDirLocked:
        results.put((os.getpid(), False))
        return
    results.put((os.getpid(), True))
    release.wait(60)
    lock.release()


def newcomers_at_once(run_dir: Path, stale: bool, contenders: int = 12) -> int:
    """How many of `contenders` processes that start together, 15 ms apart (more than the old lock's
    10 ms sleep), on a file system whose reads answer 50 ms late (NFS and Lustre latency), hold the
    heartbeat lock of `run_dir` at once; with `stale`, over a stale lock (a dead pid) to take over.
    The fault matrix case `of_many_newcomers_exactly_one_wins_the_heartbeat_lock` asserts 1."""
    if stale:
        dead = {"host": socket.gethostname(), "pid": 2**22 + 17, "started": 0, "heartbeat": 0, "token": "t"}
        (run_dir / LOCK_NAME).write_text(json.dumps(dead))
    context = multiprocessing.get_context("fork")  # light children: this module imports no torch
    start, release, results = context.Event(), context.Event(), context.Queue()
    processes = [
        context.Process(target=_contend, args=(run_dir, start, 0.015 * i, results, release))
        for i in range(contenders)
    ]
    for proc in processes:
        proc.start()
    start.set()
    try:
        outcomes = [results.get(timeout=60) for _ in processes]
    finally:
        release.set()
        for proc in processes:
            proc.join(30)
    assert not list(run_dir.glob(f"{LOCK_NAME}.*")), "a probe or break file was left behind"
    return sum(won for _, won in outcomes)
