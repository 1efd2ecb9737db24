#!/usr/bin/env bash
# One machine's part of a multi-node run: `accelerate launch --machine_rank R ARGS...`, with stop signals
# passed on to the ranks. Started once per node by slurm/train_multinode.sh (as the srun task) and by
# scripts/train/launch.sh (over ssh / pdsh). Run from the repo root:
#   MACHINE_RANK=1 bash scripts/lib/node_launch.sh OUTPUT_DIR [accelerate launch args ...]
# Without MACHINE_RANK the rank is SLURM_NODEID, read HERE, inside the task: expanded once on the batch
# host it would be the same on every node, and every node would wait to be rank 0.
set -uo pipefail
OUTPUT_DIR=${1:?usage: node_launch.sh OUTPUT_DIR [accelerate launch args ...]}
shift
machine_rank=${MACHINE_RANK:-${SLURM_NODEID:?set MACHINE_RANK, or run as an srun task (SLURM_NODEID)}}
# shellcheck source=scripts/lib/stop_signals.sh
source scripts/lib/stop_signals.sh || { echo "error: run from the framer_ds repo root on $(hostname)" >&2; exit 2; }

echo "[framer_ds] node $(hostname): machine rank $machine_rank"
run_forwarding_stop ranks accelerate launch --machine_rank "$machine_rank" "$@"
status=$?
# A stop at a checkpoint is a clean end on every node, not a failure to kill the other nodes for.
[ -f "$OUTPUT_DIR/preempted.json" ] && exit 0
exit "$status"
