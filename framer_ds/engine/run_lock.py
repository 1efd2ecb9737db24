"""One writer per run directory: the first run takes `output_dir/.framer_ds.lock`, a second one fails at
once naming the host and pid that hold it.

Why: a Slurm requeue racing a manual restart (the common case) used to run two jobs on one directory,
both appending to metrics.jsonl and deleting each other's `.tmp_step_*`. `fcntl.flock` is released by
the kernel when the holder dies, so a crash never leaves a stale lock. Some Lustre and NFS mounts have
no working flock (ENOLCK, EOPNOTSUPP, ENOSYS); there the lock is the file itself, holding host, pid and
a heartbeat the holder refreshes, and a newcomer takes it over only once the heartbeat is stale (or the
holder's pid is gone on this host).

The heartbeat lock is taken by creating the file with O_EXCL (atomic, NFS included): exactly one of
any number of newcomers creates it. It used to be "write, sleep, re-read, last writer wins", where two
runs that both read "no holder" before either wrote could both win. A stale lock is removed only under
a second exclusive create (`.framer_ds.lock.break`, a directory), after reading it again: a newcomer
that judged it stale a moment ago cannot delete the fresh lock of the one that broke it first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framer_ds.config.errors import RunSetupError
from framer_ds.storage.atomic import atomic_write_json

LOCK_NAME = ".framer_ds.lock"
NO_FLOCK_ERRNOS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
BREAK_WAIT_S = 5.0  # how long a newcomer waits for another one that is breaking a stale lock


class RunDirLocked(RunSetupError):
    """Another live run holds the run directory."""


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    started: float
    heartbeat: float
    token: str  # tells this lock apart from any other, even one taken by the same process

    @classmethod
    def me(cls) -> LockHolder:
        now = time.time()
        return cls(socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex)

    def same_process(self, other: LockHolder | None) -> bool:
        return other is not None and other.token == self.token

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host} (running since {since})"


def _read_holder(path: Path) -> LockHolder | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return LockHolder(
            str(data["host"]),
            int(data["pid"]),
            float(data["started"]),
            float(data["heartbeat"]),
            str(data["token"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _flock_works(probe: Path) -> bool:
    """Whether this file system has a working flock, tried on a private file beside the lock (the lock
    file itself must not be created here: in heartbeat mode it is created exclusively, holding its owner)."""
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as exc:
        if exc.errno not in NO_FLOCK_ERRNOS:
            raise
        return False
    finally:
        os.close(fd)
        probe.unlink()


class RunLock:
    """Held for the life of a run by ONE process (rank 0); `release` is also safe after a crash."""

    def __init__(self, output_dir: Path, *, heartbeat_s: float = 30.0, stale_after_s: float = 180.0):
        self.path = Path(output_dir) / LOCK_NAME
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.mode: str | None = None  # "flock" or "heartbeat" once held
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = LockHolder.me()

    def acquire(self) -> None:
        """Take the lock or raise RunDirLocked naming its holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not _flock_works(self.path.with_name(f"{LOCK_NAME}.{self._me.token}.probe")):
            self._acquire_by_heartbeat()
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._locked_error(_read_holder(self.path)) from None
        self._fd, self.mode = fd, "flock"
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(self._me.__dict__).encode())
        os.fsync(fd)

    def _acquire_by_heartbeat(self) -> None:
        deadline = time.monotonic() + BREAK_WAIT_S
        while not self._create():
            holder = _read_holder(self.path)
            if self._me.same_process(holder):  # an NFS retry of our own create reported EEXIST
                break
            if not self._stale(holder):
                raise self._locked_error(holder)
            if not self._break(holder) and time.monotonic() > deadline:
                raise self._locked_error(_read_holder(self.path))
        self.mode = "heartbeat"
        self._thread = threading.Thread(target=self._beat, name="framer_ds-run-lock", daemon=True)
        self._thread.start()

    def _create(self) -> bool:
        """Create the lock file holding us, atomically: False when it exists (whoever created it)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps(self._me.__dict__).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _stale(self, holder: LockHolder | None) -> bool:
        """A holder that stopped beating; a file we cannot read is stale once it is as old as that (a
        newcomer reads it between its O_EXCL create and its write: it is not stale then)."""
        if holder is not None:
            return self._is_stale(holder)
        try:
            return time.time() - self.path.stat().st_mtime > self.stale_after_s
        except FileNotFoundError:
            return True  # gone since: create again

    def _break(self, judged: LockHolder | None) -> bool:
        """Remove the stale lock we read as `judged`, holding `.break` while we look at it again.
        False when another newcomer is breaking it (we wait for the outcome)."""
        breaker = self.path.with_name(f"{LOCK_NAME}.break")
        try:
            breaker.mkdir()
        except FileExistsError:
            with contextlib.suppress(OSError):  # left by a newcomer that died while breaking
                if time.time() - breaker.stat().st_mtime > self.stale_after_s:
                    breaker.rmdir()
            time.sleep(0.05)
            return False
        try:
            now = _read_holder(self.path)
            same = now == judged if judged is None else (now is not None and now.token == judged.token)
            if same and self._stale(now):
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            breaker.rmdir()
        return True

    def _is_stale(self, holder: LockHolder) -> bool:
        if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
            return True
        return time.time() - holder.heartbeat > self.stale_after_s

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            holder = _read_holder(self.path)
            if holder is not None and not self._me.same_process(holder):
                return  # taken over after we stalled for longer than stale_after_s; nothing to refresh
            self._me = dataclasses.replace(self._me, heartbeat=time.time())
            with contextlib.suppress(OSError):
                atomic_write_json(self.path, self._me.__dict__)

    def _locked_error(self, holder: LockHolder | None) -> RunDirLocked:
        who = holder.describe() if holder is not None else "another process"
        return RunDirLocked(
            f"{self.path.parent} is in use by {who}: two runs writing one directory corrupt each other's "
            "checkpoints and metrics. Wait for it to end, stop it, or choose another output_dir "
            f"(lock file: {self.path})."
        )

    def release(self) -> None:
        if self.mode == "flock" and self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None
        elif self.mode == "heartbeat":
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=5)
            if self._me.same_process(_read_holder(self.path)):
                with contextlib.suppress(OSError):
                    self.path.unlink()
        self.mode = None
