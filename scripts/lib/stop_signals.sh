# shellcheck shell=bash
# Sourced by slurm/train_4gpu.sh, slurm/train_multinode.sh and scripts/lib/node_launch.sh (one node of
# a multi-node run): one implementation of "run the launch, pass a stop signal on to the ranks,
# requeue a preempted job".

# run_forwarding_stop MODE COMMAND...
#   Runs COMMAND in the background and waits for it. USR1/TERM (Slurm's warning before the time limit,
#   scancel, preemption) are passed on so the ranks finish the step, checkpoint, write preempted.json and
#   exit. MODE says to whom: `ranks` = COMMAND's child processes (COMMAND is `accelerate launch`, whose
#   torchrun agent would die on the signal; the ranks are its children); `self` = COMMAND itself (srun,
#   which forwards it to the task on every node). Returns COMMAND's exit status.
run_forwarding_stop() {
    local mode=$1 status=0
    shift
    FRAMER_DS_FORWARD=$mode
    FRAMER_DS_CHILD=
    trap 'forward_stop USR1' USR1
    trap 'forward_stop TERM' TERM
    "$@" &
    FRAMER_DS_CHILD=$!
    while true; do
        wait "$FRAMER_DS_CHILD"
        status=$?
        # wait returns >128 when a trapped signal interrupts it; keep waiting while the command lives.
        kill -0 "$FRAMER_DS_CHILD" 2>/dev/null || break
    done
    trap - USR1 TERM
    return "$status"
}

# shellcheck disable=SC2329  # invoked by the traps above
forward_stop() {
    echo "[framer_ds] $1 received on $(hostname): asking the ranks to checkpoint and stop"
    [ -n "$FRAMER_DS_CHILD" ] || return 0
    if [ "$FRAMER_DS_FORWARD" = ranks ]; then
        pkill "-$1" -P "$FRAMER_DS_CHILD" || kill "-$1" "$FRAMER_DS_CHILD"
    else
        kill "-$1" "$FRAMER_DS_CHILD"
    fi
}

# finish_job OUTPUT_DIR STATUS
#   A run that stopped at a checkpoint (OUTPUT_DIR/preempted.json) is requeued and the job ends 0, so
#   the requeued job resumes from it (train.resume=latest); otherwise the launch's own status is kept.
finish_job() {
    local output_dir=$1 status=$2
    if [ -f "$output_dir/preempted.json" ]; then
        echo "[framer_ds] stopped at a checkpoint: $(tr -d '\n' < "$output_dir/preempted.json")"
        if [ -n "${SLURM_JOB_ID:-}" ]; then
            scontrol requeue "$SLURM_JOB_ID" && echo "[framer_ds] requeued job $SLURM_JOB_ID"
        fi
        exit 0
    fi
    exit "$status"
}
