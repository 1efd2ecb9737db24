"""How `framer-ds smoke` runs one phase: a `framer-ds` command in this process (one-process phases:
eval, sample, export, and training of a one-process recipe), or under `accelerate launch` on CPU
processes (training of a distributed recipe); either way its outcome as one line.

Why in this process where it can: a phase pays no interpreter and import start-up (seconds each), and
runs the very command (`framer_ds.cli.main.main`) a user types. The one process-wide state a run leaves
behind, accelerate's, is reset after each phase. Why never let a phase's error escape: every phase gets
its line, and the smoke exits non-zero when any is not ok; the traceback goes to the phase's log.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from framer_ds.lab.bench import failure_reason


@dataclass
class PhaseResult:
    name: str
    ok: bool
    line: str
    seconds: float = 0.0

    def render(self) -> str:
        status = "ok" if self.ok else "FAILED"
        timing = f" ({self.seconds:.0f} s)" if self.seconds else ""
        return f"{self.name:<8} {status}{timing}: {self.line}"


class _Tee(io.TextIOBase):
    """A stream that writes to `stream` and keeps a copy (a phase's output, for its log and its line)."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False  # framer_ds's own bars are for a terminal; in a smoke they would be the log's noise


@contextlib.contextmanager
def _teed() -> Iterator[tuple[_Tee, _Tee]]:
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


# What the other ranks of a launch raise when one rank died: consequences, never the cause.
CONSEQUENCES = re.compile(r"Connection closed by peer|Connection reset by peer|ChildFailedError|SIGTERM")
RAISED = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<text>[\w.]*(?:Error|Exception): .+)$")


def error_line(output: str) -> str:
    """framer_ds's own `error: ...` line when it printed one, else the first exception a rank raised
    that is not another rank's death seen from here (a gloo peer closing), else the end of the output."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if not ours:
        raised = [m["text"] for line in lines if (m := RAISED.match(line))]
        causes = [text for text in raised if not CONSEQUENCES.search(text)]
        return causes[0][:400] if causes else failure_reason(output)
    first = ours[-1]
    problems = []  # a ConfigError's "N problem(s) in X:" is followed by one "- ..." line per problem
    for line in lines[first + 1 :]:
        if not line.startswith("- "):
            break
        problems.append(line.removeprefix("- "))
    head = lines[first].removeprefix("error: ")
    return (f"{head} {'; '.join(problems)}" if problems else head)[:400]


def run_in_process(
    name: str, command: Callable[[list[str]], int], argv: list[str], log: Path, check: Callable[[], str]
) -> PhaseResult:
    """`command(ARGV)` in this process (the CLI's `main`, handed down: lab sits below cli); `check()` says
    what the phase left (its ok line) or raises AssertionError."""
    from framer_ds.engine.accelerator import reset_accelerate_state

    started = time.perf_counter()
    rc, raised = 1, None
    with _teed() as (out, err):
        try:
            rc = command(argv)
        except (Exception, SystemExit) as exc:  # the phase's outcome; the smoke goes on to report it
            raised = exc
            traceback.print_exc(file=err.copy)
        finally:
            reset_accelerate_state()
    output = out.copy.getvalue() + err.copy.getvalue()
    _write_log(log, argv, output)
    return _outcome(name, rc if raised is None else 1, output, raised, check, started)


def run_checked(name: str, log: Path, check: Callable[[], str]) -> PhaseResult:
    """A phase that runs no command: `check()` alone (what an earlier phase left), its error caught."""
    started = time.perf_counter()
    try:
        return PhaseResult(name, True, check(), time.perf_counter() - started)
    except Exception as exc:  # the phase's outcome, reported as its line
        _write_log(log, ["check"], traceback.format_exc())
        return PhaseResult(name, False, f"{type(exc).__name__}: {exc}"[:400], time.perf_counter() - started)


def run_launched(
    name: str, launch_args: list[str], argv: list[str], log: Path, cwd: Path, check: Callable[[], str]
) -> PhaseResult:
    """`accelerate launch LAUNCH_ARGS -m framer_ds ARGV` (its output to the console and `log`)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "accelerate.commands.launch", *launch_args]
    command += ["--main_process_port", str(_free_port()), "-m", "framer_ds", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    kept = []
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            kept.append(line)
    output = "".join(kept)
    _write_log(log, command, output)
    return _outcome(name, proc.returncode, output, None, check, started)


def _outcome(
    name: str, rc: int, output: str, raised: BaseException | None, check: Callable[[], str], started: float
) -> PhaseResult:
    seconds = time.perf_counter() - started
    if raised is not None:
        text = str(raised).strip().splitlines()
        return PhaseResult(name, False, f"{type(raised).__name__}: {text[0] if text else ''}"[:400], seconds)
    if rc != 0:
        return PhaseResult(name, False, f"exit {rc}: {error_line(output)}", seconds)
    try:
        return PhaseResult(name, True, check(), seconds)
    except AssertionError as exc:
        return PhaseResult(name, False, str(exc), seconds)


def _write_log(log: Path, command: list[str], output: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(command)}\n{output}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
