#!/usr/bin/env bash
# sbatch --export=ALL,CONFIG=configs/tasks/vit_classification/vit_large_imagenet.yaml,OUTPUT_DIR=runs/vit_l slurm/train_4gpu.sh
#
# One node, 4 GPUs, accelerate + DeepSpeed (configs/accelerate_4gpu.yaml; DEEPSPEED_CONFIG swaps the JSON).
# Preemption-safe: 5 minutes before the time limit Slurm sends USR1 to this shell, which forwards it to
# the training ranks; they finish the step, checkpoint, write OUTPUT_DIR/preempted.json and exit; this
# script then requeues the job, which resumes from the newest complete checkpoint (train.resume=latest).
# TERM (scancel, scontrol requeue, preemption) checkpoints too; a plain `scancel JOB` cancels.
# CPU node: sbatch --gres=none --cpus-per-task=2 --export=ALL,CONFIG=...,OUTPUT_DIR=...,\
#   ACCELERATE_CONFIG=configs/accelerate_cpu_2proc.yaml,OMP_NUM_THREADS=1 slurm/train_4gpu.sh
# The output goes to logs/ (it ships with the repo: Slurm cannot create it, and fails the job without it).
#SBATCH --job-name=framer_ds
#SBATCH --nodes=1
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
OUTPUT_DIR=${OUTPUT_DIR:?set OUTPUT_DIR: the run directory (also where the preemption marker is written)}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate_4gpu.yaml}
DEEPSPEED_CONFIG=${DEEPSPEED_CONFIG:-}
# The task's CPUs shared by the GPUs Slurm allocated (32 / 4 = 8 with the lines above).
threads=$((${SLURM_CPUS_PER_TASK:-8} / ${SLURM_GPUS_ON_NODE:-1}))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))}

launch=(accelerate launch --config_file "$ACCELERATE_CONFIG")
[ -n "$DEEPSPEED_CONFIG" ] && launch+=(--deepspeed_config_file "$DEEPSPEED_CONFIG")
launch+=(-m framer_ds train "$CONFIG" "output_dir=$OUTPUT_DIR" train.resume=latest "$@")

# sbatch runs a copy of this script from its spool directory: the helpers are found from the submit
# directory (the repo root, as every path above).
# shellcheck source=scripts/lib/stop_signals.sh
source scripts/lib/stop_signals.sh || { echo "run sbatch from the framer_ds repo root" >&2; exit 2; }

rm -f "$OUTPUT_DIR/preempted.json"
echo "[framer_ds] job ${SLURM_JOB_ID:-local} restart ${SLURM_RESTART_COUNT:-0}: ${launch[*]}"
run_forwarding_stop ranks "${launch[@]}"
finish_job "$OUTPUT_DIR" $?
