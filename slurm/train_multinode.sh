#!/usr/bin/env bash
# sbatch --nodes=2 --export=ALL,CONFIG=configs/tasks/vit_classification/vit_large_imagenet.yaml,OUTPUT_DIR=runs/vit_l slurm/train_multinode.sh
#
# N nodes x GPUS_PER_NODE GPUs, accelerate + DeepSpeed (configs/accelerate_multinode.yaml; static
# rendezvous). One srun task per node starts `accelerate launch` with its own machine rank (from
# SLURM_NODEID, read inside the task); the head node is the allocation's first host; the port is
# MASTER_PORT or derived from the job id, so two jobs sharing a node do not collide.
# Before training, ENV_CHECK=1 (default) runs `framer-ds env` under the same launch: every rank must
# reach every other within 120 s, or the job ends with the backend's error and a hint (interface, IB,
# firewall, port) instead of hanging at rendezvous until the time limit.
# Preemption-safe like slurm/train_4gpu.sh: USR1 5 minutes before the limit is forwarded to every
# node's ranks; they checkpoint, write OUTPUT_DIR/preempted.json (OUTPUT_DIR on a shared filesystem),
# and the job is requeued to resume from it (train.resume=latest). TERM (scancel, scontrol requeue,
# preemption) checkpoints too, and a plain `scancel JOB` cancels (scripts/lib/stop_signals.sh).
# Overrides: CONFIG, OUTPUT_DIR, ACCELERATE_CONFIG, DEEPSPEED_CONFIG, GPUS_PER_NODE (default: the GPUs
# Slurm gave each node, else 1 process per node), MASTER_PORT, ENV_CHECK, OMP_NUM_THREADS (default:
# the task's CPUs / GPUS_PER_NODE); NCCL_SOCKET_IFNAME / NCCL_IB_DISABLE / GLOO_SOCKET_IFNAME /
# NCCL_DEBUG reach every rank.
# CPU nodes: sbatch --nodes=2 --gres=none --cpus-per-task=N --export=ALL,CONFIG=...,OUTPUT_DIR=... slurm/train_multinode.sh
# The output goes to logs/ (it ships with the repo: Slurm cannot create it, and fails the job without it).
#SBATCH --job-name=framer_ds
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%j.out
set -uo pipefail

CONFIG=${CONFIG:?set CONFIG=path/to/train.yaml (sbatch --export=ALL,CONFIG=...)}
OUTPUT_DIR=${OUTPUT_DIR:?set OUTPUT_DIR: the run directory, on a filesystem every node shares}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate_multinode.yaml}
DEEPSPEED_CONFIG=${DEEPSPEED_CONFIG:-}
ENV_CHECK=${ENV_CHECK:-1}
JOB_ID=${SLURM_JOB_ID:?run under Slurm: sbatch --nodes=N slurm/train_multinode.sh}
MASTER_PORT=${MASTER_PORT:-$((20000 + JOB_ID % 20000))}
# The same script on GPU nodes (#SBATCH --gres=gpu:4) and CPU nodes (sbatch --gres=none): one rank per
# GPU Slurm allocated (SLURM_GPUS_ON_NODE), else per GPU this node has, else one rank per node.
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}}
[ "$GPUS_PER_NODE" -ge 1 ] 2>/dev/null || GPUS_PER_NODE=1
threads=$((${SLURM_CPUS_PER_TASK:-$GPUS_PER_NODE} / GPUS_PER_NODE))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))}
# srun passes the whole environment to every task; name the knobs so the log shows what reached them.
for knob in NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_DEBUG GLOO_SOCKET_IFNAME; do
    [ -n "${!knob:-}" ] && export "${knob?}" && echo "[framer_ds] $knob=${!knob}"
done

# shellcheck source=scripts/lib/stop_signals.sh
source scripts/lib/stop_signals.sh || { echo "run sbatch from the framer_ds repo root" >&2; exit 2; }

NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:?SLURM_JOB_NUM_NODES is unset}}
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
[ -n "$HEAD" ] || { echo "error: no head node from scontrol show hostnames '$SLURM_JOB_NODELIST'" >&2; exit 2; }
TOTAL=$((NODES * GPUS_PER_NODE))

rendezvous=(--config_file "$ACCELERATE_CONFIG" --num_machines "$NODES" --num_processes "$TOTAL"
            --main_process_ip "$HEAD")
launch_args=("${rendezvous[@]}" --main_process_port "$MASTER_PORT")
[ -n "$DEEPSPEED_CONFIG" ] && launch_args+=(--deepspeed_config_file "$DEEPSPEED_CONFIG")
train_args=(-m framer_ds train "$CONFIG" "output_dir=$OUTPUT_DIR" train.resume=latest "$@")
validate_args=(--accelerate-config "$ACCELERATE_CONFIG" --num-machines "$NODES" --num-processes "$TOTAL"
               --main-process-ip "$HEAD" --main-process-port "$MASTER_PORT")
[ -n "$DEEPSPEED_CONFIG" ] && validate_args+=(--deepspeed-config "$DEEPSPEED_CONFIG")
node_task=(srun --nodes="$NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash scripts/lib/node_launch.sh "$OUTPUT_DIR")

echo "[framer_ds] job $JOB_ID restart ${SLURM_RESTART_COUNT:-0}: $NODES node(s) x $GPUS_PER_NODE, head $HEAD:$MASTER_PORT, OMP_NUM_THREADS=$OMP_NUM_THREADS"
# Fail here, in seconds, not after every node has loaded the model: the three configs and the counts agree.
python -m framer_ds validate "$CONFIG" "output_dir=$OUTPUT_DIR" "$@" "${validate_args[@]}" || exit 2
if [ "$ENV_CHECK" = 1 ]; then
    # On the port after the training one (its socket may linger a while); the agents' rendezvous gets the
    # same timeout as the ranks', so a node that cannot reach the head fails in 2 minutes, not 10.
    echo "[framer_ds] rendezvous check: framer-ds env on all $TOTAL ranks"
    "${node_task[@]}" "${rendezvous[@]}" --main_process_port $((MASTER_PORT + 1)) --rdzv_conf timeout=120 \
        -m framer_ds env --timeout 120 --output-dir "$(dirname "$OUTPUT_DIR")" || {
        echo "error: the ranks cannot reach each other (see the hint above); not training" >&2
        exit 3
    }
fi

rm -f "$OUTPUT_DIR/preempted.json"
echo "[framer_ds] ${node_task[*]} --machine_rank \$SLURM_NODEID ${launch_args[*]} ${train_args[*]}"
run_forwarding_stop self "${node_task[@]}" "${launch_args[@]}" "${train_args[@]}"
finish_job "$OUTPUT_DIR" $?
