"""A launched rank leaves past the interpreter's teardown, with everything it wrote flushed
(framer_ds/cli/process_exit.py says why: DeepSpeed keeps gloo groups alive into teardown, where a rank
could abort after a finished run); a single process leaves the ordinary way, its atexit hooks run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import atexit, logging, sys
from framer_ds.cli.process_exit import leave
atexit.register(lambda: print("teardown ran", flush=True))
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("framer_ds").info("the run's last log line")
print("the run's last line", end="")  # buffered: no newline, no flush
leave(int(sys.argv[2]))
"""


@pytest.mark.parametrize(("world_size", "teardown"), [("2", False), ("1", True)])
def test_leave_flushes_what_was_written_and_skips_teardown_only_in_a_launched_rank(
    tmp_path: Path, world_size: str, teardown: bool
) -> None:
    log = tmp_path / "run.log"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log), "3"],
        env={**os.environ, "WORLD_SIZE": world_size},
        capture_output=True,  # pipes: stdout is block-buffered, as under a launcher
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("the run's last line"), proc.stdout
    assert ("teardown ran" in proc.stdout) is teardown
    assert "the run's last log line" in log.read_text()
