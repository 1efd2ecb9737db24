"""The run-directory lock: flock where it works, a heartbeat file where it does not (some Lustre/NFS)."""

from __future__ import annotations

import errno
import json
import socket
import time

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
