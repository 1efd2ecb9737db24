# shellcheck shell=bash
# Sourced by slurm/train_4gpu.sh, slurm/train_multinode.sh and scripts/lib/node_launch.sh (one node of
# a multi-node run): one implementation of "run the launch, pass a stop signal on to the ranks,
# requeue a job that Slurm warned of its time limit".
#
# The signals, and what each means (docs/cluster.md, "Stopping, requeueing, cancelling"):
#   USR1  Slurm's warning before the time limit (#SBATCH --signal=B:USR1@300), or a user's
#         `scancel --signal=USR1 --batch JOB`: checkpoint, and this script requeues the job.
#   TERM  `scancel JOB` (cancel), `scontrol requeue JOB` and preemption: checkpoint, and do NOT requeue.
#         A user's scancel must cancel; after `scontrol requeue` and a preemption with
#         PreemptMode=REQUEUE Slurm requeues the job itself. Slurm SIGKILLs whatever still runs KillWait
#         seconds (site config, often 30) after the TERM.

# Seconds torchrun's agent waits for the ranks after passing a stop signal on, before it SIGKILLs them.
# torch's default (TORCH_ELASTIC_SHUTDOWN_TIMEOUT=30) would kill a checkpoint of a large ZeRO state
# mid-write; USR1 comes 300 s before the time limit, so the ranks may use all of that.
FRAMER_DS_STOP_WINDOW_S=${FRAMER_DS_STOP_WINDOW_S:-300}
# Slurm SIGKILLs a job KillWait seconds after its TERM: the ranks warn when a checkpoint takes longer
# (framer_ds/train/stop_window.py). Asked once, on the batch host; srun passes it on to the nodes.
if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${FRAMER_DS_KILL_WAIT_S:-}" ]; then
    FRAMER_DS_KILL_WAIT_S=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
    if [ -n "$FRAMER_DS_KILL_WAIT_S" ]; then export FRAMER_DS_KILL_WAIT_S; fi
fi

# run_forwarding_stop MODE COMMAND...
#   Runs COMMAND in the background and waits for it. USR1/TERM are passed on so the ranks finish the
#   step, checkpoint, write preempted.json and exit. MODE says to whom: `ranks` = COMMAND's child
#   processes (COMMAND is `accelerate launch`, the ranks are children of its torchrun agent); `self` =
#   COMMAND itself (srun, which forwards it to the task on every node). Returns COMMAND's exit status;
#   the signal received is left in FRAMER_DS_STOP_SIGNAL.
run_forwarding_stop() {
    local mode=$1 status=0
    shift
    FRAMER_DS_FORWARD=$mode
    FRAMER_DS_CHILD=
    FRAMER_DS_STOP_SIGNAL=
    if [ "$mode" = ranks ]; then
        # Under srun every process of the step gets the signal, torchrun's agent too: without a USR1
        # handler it died at once (exit 138), before its ranks had checkpointed, and srun tore the
        # step down. With one it passes the signal on and waits for the ranks (up to the timeout).
        export PET_SIGNALS_TO_HANDLE=${PET_SIGNALS_TO_HANDLE:-SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1}
        export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-$FRAMER_DS_STOP_WINDOW_S}
    fi
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
    # The first signal decides: a TERM (Slurm's kill) after a USR1 does not undo the requeue.
    FRAMER_DS_STOP_SIGNAL=${FRAMER_DS_STOP_SIGNAL:-$1}
    [ -n "$FRAMER_DS_CHILD" ] || return 0
    if [ "$FRAMER_DS_FORWARD" = ranks ]; then
        pkill "-$1" -P "$FRAMER_DS_CHILD" || kill "-$1" "$FRAMER_DS_CHILD"
    else
        kill "-$1" "$FRAMER_DS_CHILD"
    fi
}

# finish_job OUTPUT_DIR STATUS
#   A run that stopped at a checkpoint (OUTPUT_DIR/preempted.json): after USR1 the job is requeued and
#   resumes from it (train.resume=latest), and this ends 0; after TERM it is not (see the top of this
#   file), and this ends 75 (EX_TEMPFAIL, the ranks' own status): a job that stopped short of the end is
#   never reported COMPLETED. Otherwise the launch's own status is kept.
finish_job() {
    local output_dir=$1 status=$2
    if [ -f "$output_dir/preempted.json" ]; then
        echo "[framer_ds] stopped at a checkpoint: $(tr -d '\n' < "$output_dir/preempted.json")"
        if [ -n "${SLURM_JOB_ID:-}" ] && [ "${FRAMER_DS_STOP_SIGNAL:-}" = USR1 ]; then
            # Said before it is done: a requeue kills this script at once, and under load the kill beat
            # an echo placed after `scontrol requeue` (the line was lost from the job's log).
            echo "[framer_ds] requeueing job $SLURM_JOB_ID: it resumes from this checkpoint"
            scontrol requeue "$SLURM_JOB_ID" && exit 0
            echo "[framer_ds] scontrol requeue $SLURM_JOB_ID failed: submit the same command again to resume"
        elif [ -n "${SLURM_JOB_ID:-}" ]; then
            echo "[framer_ds] ${FRAMER_DS_STOP_SIGNAL:-a stop signal} (scancel, scontrol requeue or preemption):" \
                 "not requeued by this script; submit the same command again to resume from the checkpoint"
        fi
        exit 75
    fi
    exit "$status"
}
