#!/usr/bin/env bash
# sbatch --export=ALL,CONFIG=configs/tasks/vit_classification/vit_large_imagenet.yaml,OUTPUT_DIR=runs/vit_l slurm/train_4gpu.sh
#
# One node, 4 GPUs, accelerate + DeepSpeed (configs/accelerate_4gpu.yaml; DEEPSPEED_CONFIG swaps the JSON).
# Preemption-safe: 5 minutes before the time limit Slurm sends USR1 to this shell, which forwards it to
# the training ranks; they finish the step, checkpoint, write OUTPUT_DIR/preempted.json and exit; this
# script then requeues the job, which resumes from the newest complete checkpoint (train.resume=latest).
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
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

launch=(accelerate launch --config_file "$ACCELERATE_CONFIG")
[ -n "$DEEPSPEED_CONFIG" ] && launch+=(--deepspeed_config_file "$DEEPSPEED_CONFIG")
launch+=(-m framer_ds train "$CONFIG" "output_dir=$OUTPUT_DIR" train.resume=latest "$@")

rm -f "$OUTPUT_DIR/preempted.json"
echo "[framer_ds] job ${SLURM_JOB_ID:-local} restart ${SLURM_RESTART_COUNT:-0}: ${launch[*]}"
"${launch[@]}" &
launcher=$!

# The launcher (torchrun) would die on USR1; the ranks are its children and checkpoint on it.
# shellcheck disable=SC2329  # invoked by the traps below
forward_stop() {
    echo "[framer_ds] $1 received: asking the ranks to checkpoint and stop"
    pkill "-$1" -P "$launcher" || kill "-$1" "$launcher"
}
trap 'forward_stop USR1' USR1
trap 'forward_stop TERM' TERM

status=0
while true; do
    wait "$launcher"
    status=$?
    # wait returns >128 when a trapped signal interrupts it; keep waiting while the launcher lives.
    kill -0 "$launcher" 2>/dev/null || break
done

if [ -f "$OUTPUT_DIR/preempted.json" ]; then
    echo "[framer_ds] stopped at a checkpoint: $(cat "$OUTPUT_DIR/preempted.json" | tr -d '\n')"
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        scontrol requeue "$SLURM_JOB_ID" && echo "[framer_ds] requeued job $SLURM_JOB_ID"
    fi
    exit 0
fi
exit "$status"
