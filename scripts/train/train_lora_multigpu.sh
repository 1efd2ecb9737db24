#!/usr/bin/env bash
# NUM_GPUS=4 BATCH_SIZE=1 GRADIENT_ACCUM=4 HEIGHT=576 WIDTH=576 NUM_FRAMES=10 DEEPSPEED_CONFIG=configs/deepspeed/zero2.json scripts/train/train_lora_multigpu.sh [CONFIG] [key=value ...]
#
# Multi-GPU SVD LoRA training on one node. Every variable below REALLY reaches the run: each becomes a
# --flag of `accelerate launch` or a key=value override of the training YAML (printed before launch).
set -euo pipefail
CONFIG=${1:-configs/tasks/video_lora/svd_interp_576x576_10f.yaml}
[ $# -gt 0 ] && shift
NUM_GPUS=${NUM_GPUS:-4}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate_4gpu.yaml}
DEEPSPEED_CONFIG=${DEEPSPEED_CONFIG:-configs/deepspeed/zero2.json}

overrides=()
[ -n "${BATCH_SIZE:-}" ] && overrides+=("train.micro_batch_size=$BATCH_SIZE")
[ -n "${GRADIENT_ACCUM:-}" ] && overrides+=("train.gradient_accumulation_steps=$GRADIENT_ACCUM")
[ -n "${HEIGHT:-}" ] && overrides+=("data.height=$HEIGHT")
[ -n "${WIDTH:-}" ] && overrides+=("data.width=$WIDTH")
[ -n "${NUM_FRAMES:-}" ] && overrides+=("data.num_frames=$NUM_FRAMES")
[ -n "${OUTPUT_DIR:-}" ] && overrides+=("output_dir=$OUTPUT_DIR")

launch=(accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "$NUM_GPUS"
        --deepspeed_config_file "$DEEPSPEED_CONFIG" -m framer_ds train "$CONFIG" "${overrides[@]}" "$@")
# Fail here, not after the queue: the YAML, the accelerate YAML and the DeepSpeed JSON must agree.
python -m framer_ds validate "$CONFIG" "${overrides[@]}" "$@" \
    --accelerate-config "$ACCELERATE_CONFIG" --deepspeed-config "$DEEPSPEED_CONFIG"
echo "+ ${launch[*]}"
exec "${launch[@]}"
