"""slurm/train_4gpu.sh with stub `accelerate` and `scontrol`: the USR1 warning reaches the ranks and
the job is requeued, a failed run keeps its failing status, overrides reach the launcher.

Why stubs here, when the Slurm scripts run on a real two-node cluster (tests/launch/test_cluster.py:
train_4gpu.sh cancelled by scancel, train_multinode.sh requeued by USR1 and scontrol requeue)? On one
node `--signal=B:USR1` reaches the batch shell alone, so only this script's own forwarding gets it to the
ranks (multi-node, Slurm signals every process of the step itself); and a launch that fails must not be
requeued. Both are about the script, not about Slurm, and a stub launcher shows them in seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "slurm" / "train_4gpu.sh"

# A fake launcher: logs its arguments, starts one "rank" child that behaves like framer_ds on a stop
# signal (writes the marker, exits 75), and waits for it like torchrun does.
FAKE_ACCELERATE = r"""#!/usr/bin/env bash
echo "$@" > "$STUB_LOG/accelerate_args"
out=""; for a in "$@"; do case "$a" in output_dir=*) out="${a#output_dir=}";; esac; done
mkdir -p "$out"
bash -c '
  trap "echo {\"step\": 3} > \"$0/preempted.json\"; exit 75" USR1 TERM
  echo started > "$1/rank_started"
  for i in $(seq 1 ${STUB_TICKS:-300}); do sleep 0.1; done
  exit "${STUB_EXIT:-0}"
' "$out" "$STUB_LOG" &
wait $!
exit $?
"""
FAKE_SCONTROL = '#!/usr/bin/env bash\necho "$@" >> "$STUB_LOG/scontrol_calls"\n'


def setup_stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("accelerate", FAKE_ACCELERATE), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "CONFIG": "configs/quickstart.yaml",
        "OUTPUT_DIR": str(tmp_path / "run"),
        "DEEPSPEED_CONFIG": "configs/deepspeed/zero3.json",
    }


def requeues(tmp_path: Path) -> list[str]:
    """The script's `scontrol requeue` calls (it also asks `scontrol show config` for KillWait)."""
    calls = tmp_path / "scontrol_calls"
    return [c for c in calls.read_text().splitlines() if c.startswith("requeue")] if calls.exists() else []


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_usr1_is_forwarded_and_the_job_requeued(tmp_path):
    env = setup_stubs(tmp_path)
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "train.length.steps=9"],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_for(tmp_path / "rank_started")
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert requeues(tmp_path) == ["requeue 4242"]
    args = (tmp_path / "accelerate_args").read_text()
    assert "--deepspeed_config_file configs/deepspeed/zero3.json" in args
    assert (
        "train.resume=latest" in args
        and "train.length.steps=9" in args
        and f"output_dir={tmp_path / 'run'}" in args
    )


def test_a_failed_run_is_not_requeued_and_keeps_its_status(tmp_path):
    env = {**setup_stubs(tmp_path), "STUB_EXIT": "3", "STUB_TICKS": "3"}
    proc = subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert requeues(tmp_path) == []
