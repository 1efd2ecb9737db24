"""Fake cluster tools for the launch tests: `srun`, `scontrol`, `sbatch`, `ssh`, `pdsh` that run
everything on this machine, so the scripts' real per-node commands start real processes that meet over
loopback. Each logs its arguments to $STUB_LOG/<tool>_calls."""

from __future__ import annotations

import os
from pathlib import Path

# Runs the task once per node (SLURM_JOB_NUM_NODES) with that node's SLURM_NODEID, as srun does on each
# node of the allocation; forwards USR1/TERM to every task, as srun does.
SRUN = r"""#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG/srun_calls"
while [ $# -gt 0 ]; do case "$1" in --*) shift;; *) break;; esac; done
pids=()
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
    pids+=($!)
done
worst=0
for pid in "${pids[@]}"; do
    while true; do wait "$pid"; code=$?; kill -0 "$pid" 2>/dev/null || break; done
    [ "$code" -gt "$worst" ] && worst=$code
done
exit "$worst"
"""
SCONTROL = r"""#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG/scontrol_calls"
if [ "$1 $2" = "show hostnames" ]; then tr ',' '\n' <<< "$3"; fi
"""
# `sbatch --nodes=N script`: runs the batch script here with the variables Slurm would set.
SBATCH = r"""#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG/sbatch_calls"
nodes=1
while [ $# -gt 0 ]; do case "$1" in --nodes=*) nodes=${1#--nodes=}; shift;; --*) shift;; *) break;; esac; done
export SLURM_JOB_ID=${FAKE_JOB_ID:-4242} SLURM_JOB_NUM_NODES=$nodes SLURM_NNODES=$nodes
export SLURM_JOB_NODELIST=${FAKE_NODELIST:?} SLURM_SUBMIT_DIR=$PWD
exec bash "$@"
"""
# `ssh [options] HOST COMMAND`: runs COMMAND here; hosts named unreachable* fail like ssh does.
SSH = r"""#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG/ssh_calls"
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in unreachable*)
    echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255;;
esac
exec bash -c "$*"
"""
# `pdsh [-S] [-f N] -w h1,h2 COMMAND`: runs COMMAND once per host with %n = its position, as pdsh does.
PDSH = r"""#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG/pdsh_calls"
hosts=""
while [ $# -gt 0 ]; do
    case "$1" in -w) hosts=$2; shift 2;; -f|-R|-l) shift 2;; -*) shift;; *) break;; esac
done
IFS=, read -ra names <<< "$hosts"
pids=()
for n in "${!names[@]}"; do
    cmd=$*
    # pipefail: the host's exit status, not sed's (a failed host used to look like a success)
    (set -o pipefail; bash -c "${cmd//%n/$n}" 2>&1 | sed -u "s/^/${names[$n]}: /") &
    pids+=($!)
done
worst=0
for pid in "${pids[@]}"; do wait "$pid"; code=$?; [ "$code" -gt "$worst" ] && worst=$code; done
exit "$worst"
"""

TOOLS = {"srun": SRUN, "scontrol": SCONTROL, "sbatch": SBATCH, "ssh": SSH, "pdsh": PDSH}


def install_cluster_stubs(directory: Path, tools: tuple[str, ...] = tuple(TOOLS)) -> Path:
    """Writes the fake tools into directory/bin; returns that directory (put it first on PATH)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in tools:
        (bin_dir / name).write_text(TOOLS[name])
        (bin_dir / name).chmod(0o755)
    return bin_dir


def stub_env(directory: Path, bin_dir: Path, python_bin: Path, **extra: str) -> dict[str, str]:
    """The environment of a launch through the fakes: their log dir, them first on PATH, then the venv."""
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{python_bin}:{os.environ['PATH']}",
        "STUB_LOG": str(directory),
        "OMP_NUM_THREADS": "1",
        **extra,
    }
