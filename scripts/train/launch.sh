#!/usr/bin/env bash
# NUM_GPUS=4 CONFIG=configs/tasks/vit_classification/vit_large_imagenet.yaml scripts/train/launch.sh [key=value ...]
# HOSTFILE=configs/hostfile.example CONFIG_NAME=vit_large_imagenet DEEPSPEED_CONFIG=configs/deepspeed/zero3.json scripts/train/launch.sh
#
# One launcher for this machine, or for every machine of a DeepSpeed hostfile, with the interface of
# the old training scripts. Every variable REALLY reaches the run (the command is printed first):
#   CONFIG            a training YAML; or CONFIG_NAME: its name under configs/tasks/*/ (or configs/)
#   NUM_GPUS          processes per machine (default: the hostfile's slots, else nvidia-smi's GPU count, else 1)
#   MASTER_PORT       rendezvous port (default 29500); MASTER_ADDR the head node (default: first host)
#   DEEPSPEED_CONFIG  the DeepSpeed JSON (default: the one the accelerate YAML names)
#   ACCELERATE_CONFIG default configs/accelerate_4gpu.yaml, with HOSTFILE configs/accelerate_multinode.yaml
#   OUTPUT_DIR        the run directory (output_dir=...; with HOSTFILE on a filesystem all hosts share)
#   HOSTFILE          `node-a slots=4` lines; INCLUDE / EXCLUDE filter it like deepspeed's -i / -e
#   REMOTE_LAUNCHER   pdsh (default when installed) or ssh; SSH_TIMEOUT seconds to reach a host (10)
# With HOSTFILE, every host must reach the others, share this directory at the same path, and have
# passwordless ssh from here. Each host runs scripts/lib/node_launch.sh with its machine rank. Ctrl-C
# (or TERM) asks every host's ranks to checkpoint and stop; a host that cannot be reached or fails
# stops the launch with its name.
set -euo pipefail

if [ -z "${CONFIG:-}" ] && [ -n "${CONFIG_NAME:-}" ]; then
    shopt -s nullglob
    found=(configs/tasks/*/"$CONFIG_NAME".yaml configs/"$CONFIG_NAME".yaml)
    shopt -u nullglob
    [ ${#found[@]} -eq 1 ] || {
        echo "error: CONFIG_NAME=$CONFIG_NAME matches ${#found[@]} configs (${found[*]:-none} under configs/); set CONFIG=path instead" >&2
        exit 2
    }
    CONFIG=${found[0]}
fi
CONFIG=${CONFIG:?set CONFIG=path/to/train.yaml or CONFIG_NAME=name (e.g. quickstart)}
MASTER_PORT=${MASTER_PORT:-29500}
DEEPSPEED_CONFIG=${DEEPSPEED_CONFIG:-}
SSH_TIMEOUT=${SSH_TIMEOUT:-10}
PYTHON=${PYTHON:-$(command -v python)}
overrides=("$@")
[ -n "${OUTPUT_DIR:-}" ] && overrides+=("output_dir=$OUTPUT_DIR")

# The `accelerate launch` flags, and the same values for `framer-ds validate`, which checks them first.
start_launch_args() {
    launch_args=(--config_file "$ACCELERATE_CONFIG")
    validate_args=(--accelerate-config "$ACCELERATE_CONFIG")
    if [ -n "$DEEPSPEED_CONFIG" ]; then
        launch_args+=(--deepspeed_config_file "$DEEPSPEED_CONFIG")
        validate_args+=(--deepspeed-config "$DEEPSPEED_CONFIG")
    fi
}
launch_flag() {  # NAME VALUE: accelerate's --NAME, validate's --NAME-with-dashes
    launch_args+=("--$1" "$2")
    validate_args+=("--${1//_/-}" "$2")
}

if [ -z "${HOSTFILE:-}" ]; then
    ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate_4gpu.yaml}
    if [ -z "${NUM_GPUS:-}" ]; then
        NUM_GPUS=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
        [ "$NUM_GPUS" -ge 1 ] || NUM_GPUS=1
    fi
    start_launch_args
    launch_flag num_processes "$NUM_GPUS"
    launch_flag main_process_port "$MASTER_PORT"
    "$PYTHON" -m framer_ds validate "$CONFIG" "${overrides[@]}" "${validate_args[@]}"
    echo "+ accelerate launch ${launch_args[*]} -m framer_ds train $CONFIG ${overrides[*]}"
    exec "$PYTHON" -m accelerate.commands.launch "${launch_args[@]}" -m framer_ds train "$CONFIG" "${overrides[@]}"
fi

# --- several machines ------------------------------------------------------------------------------
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate_multinode.yaml}
filter=()
[ -n "${INCLUDE:-}" ] && filter+=(--include "$INCLUDE")
[ -n "${EXCLUDE:-}" ] && filter+=(--exclude "$EXCLUDE")
[ -n "${NUM_GPUS:-}" ] && filter+=(--num-gpus "$NUM_GPUS")
# "RANK HOST SLOTS" per line, parsed as DeepSpeed's runner would; every problem of the file at once.
host_lines=$("$PYTHON" -m framer_ds hosts "$HOSTFILE" "${filter[@]}" --same-slots) || exit 2
mapfile -t host_lines <<< "$host_lines"
hosts=() slots=()
for line in "${host_lines[@]}"; do
    read -r _ host host_slots <<< "$line"
    hosts+=("$host")
    slots+=("$host_slots")
done
NODES=${#hosts[@]}
PER_NODE=$(tr ',' '\n' <<< "${slots[0]}" | wc -l)
TOTAL=$((NODES * PER_NODE))
MASTER_ADDR=${MASTER_ADDR:-${hosts[0]}}
OUTPUT_DIR_OF_RUN=${OUTPUT_DIR:-$("$PYTHON" -m framer_ds config get output_dir "$CONFIG" "${overrides[@]}")}

start_launch_args
launch_flag num_machines "$NODES"
launch_flag num_processes "$TOTAL"
launch_flag main_process_ip "$MASTER_ADDR"
launch_flag main_process_port "$MASTER_PORT"
"$PYTHON" -m framer_ds validate "$CONFIG" "${overrides[@]}" "${validate_args[@]}"

# Fail fast, naming the host, before any node waits at the rendezvous for one that never comes.
for host in "${hosts[@]}"; do
    ssh -o BatchMode=yes -o ConnectTimeout="$SSH_TIMEOUT" "$host" true </dev/null || {
        echo "error: cannot reach $host over ssh within ${SSH_TIMEOUT}s: check the name in $HOSTFILE, that it" \
             "is up, and passwordless ssh from $(hostname) (ssh-copy-id $host); or drop it with EXCLUDE=$host" >&2
        exit 2
    }
done

# What each host runs, in this directory, with the environment that shapes the run (ssh passes none).
# Tokens (WANDB_API_KEY, HF_TOKEN, ...) do not go on the command line, where `ps` on every host shows
# them: into a file only this user can read, in this (shared) directory, sourced by each host's command
# and deleted when the launch ends.
launch_id="framer_ds_launch_$$_$RANDOM"
exports="" secrets_file=""
while IFS= read -r name; do
    line="export $name=$(printf '%q' "${!name}")"
    if [[ ${name^^} =~ (API_KEY|TOKEN|SECRET|PASSWORD) ]]; then
        if [ -z "$secrets_file" ]; then
            secrets_file="$PWD/.framer_ds_env.$launch_id"
            (umask 077 && : > "$secrets_file")
            trap 'rm -f "$secrets_file"' EXIT
            exports+=". $(printf '%q' "$secrets_file"); "
        fi
        echo "$line" >> "$secrets_file"
    else
        exports+="$line; "
    fi
done < <(compgen -e | grep -E '^(NCCL_|GLOO_|OMP_NUM_THREADS$|PYTHONPATH$|WANDB_|HF_|HUGGING_FACE_|TRANSFORMERS_|FRAMER_DS_|TORCH_|UCX_|FI_)' || true)
# shellcheck disable=SC2016  # $PATH is the remote host's, expanded there
exports+="export PATH=$(printf '%q' "$(dirname "$PYTHON")"):\"\$PATH\"; "
node_command() {  # $1 = machine rank (a number, or pdsh's %n), $2 = the host's slots
    local devices=""
    [ "$2" != "$(seq -s, 0 $((PER_NODE - 1)))" ] && devices="export CUDA_VISIBLE_DEVICES=$2; "
    printf 'cd %q && %s%sMACHINE_RANK=%s exec -a %s bash scripts/lib/node_launch.sh %q' \
        "$PWD" "$exports" "$devices" "$1" "$launch_id" "$OUTPUT_DIR_OF_RUN"
    printf ' %q' "${launch_args[@]}" -m framer_ds train "$CONFIG" "${overrides[@]}"
}

# Ctrl-C / TERM: every host's ranks checkpoint and stop. Only a node launcher's command line STARTS with
# the launch id (exec -a): not pkill's own shell, nor the ssh / pdsh clients on the head node.
stop_nodes() {
    echo "[framer_ds] stopping: asking the ranks on ${hosts[*]} to checkpoint and stop" >&2
    # Every host at once: one after the other, the first hosts' ranks could stop, agree with the rest to
    # checkpoint and exit before the last host's signal arrived (it then hit a rank on its way out).
    local host stoppers=()
    for host in "${hosts[@]}"; do
        ssh -o BatchMode=yes -o ConnectTimeout="$SSH_TIMEOUT" "$host" \
            "pkill -TERM -f '^$launch_id '" </dev/null &
        stoppers+=($!)
    done
    wait "${stoppers[@]}" || true
}
trap stop_nodes INT TERM

finish() {  # $1 = the launch's status
    if [ -f "$OUTPUT_DIR_OF_RUN/preempted.json" ]; then
        echo "[framer_ds] stopped at a checkpoint: $(tr -d '\n' < "$OUTPUT_DIR_OF_RUN/preempted.json")"
        echo "[framer_ds] to continue, run the same command with train.resume=latest"
    fi
    exit "$1"
}

echo "+ $NODES host(s) x $PER_NODE: accelerate launch --machine_rank R ${launch_args[*]} -m framer_ds train $CONFIG ${overrides[*]}"
if [ "${REMOTE_LAUNCHER:-$(command -v pdsh >/dev/null && echo pdsh || echo ssh)}" = pdsh ]; then
    uniform=1
    for s in "${slots[@]}"; do [ "$s" = "${slots[0]}" ] || uniform=0; done
    if [ "$uniform" = 1 ]; then
        # pdsh replaces %n with the host's position in -w, i.e. its machine rank; -S returns the worst status.
        # -R ssh: Debian's pdsh defaults to rsh ("connect: Connection refused" on a machine with ssh only).
        pdsh -R ssh -S -f 1024 -w "$(IFS=,; echo "${hosts[*]}")" "$(node_command %n "${slots[0]}")" &
        pdsh_pid=$!
        status=0
        while kill -0 "$pdsh_pid" 2>/dev/null; do status=0; wait "$pdsh_pid" || status=$?; done
        finish "$status"
    fi
    echo "[framer_ds] the hosts use different GPU indices: launching over ssh instead of pdsh"
fi

pids=()
for rank in "${!hosts[@]}"; do
    # Each host's ssh client and its line prefixing in a session of their own: a terminal's Ctrl-C reaches
    # this script, which asks the nodes to stop, but not the clients, which carry the nodes' output
    # (their checkpoint lines) until the nodes have stopped. Killed by it, they lost that output.
    # shellcheck disable=SC2016  # expanded by that bash, from its arguments
    setsid bash -c 'set -o pipefail; ssh -o BatchMode=yes -o ConnectTimeout="$1" "$2" "$3" </dev/null 2>&1 \
        | sed -u "s/^/[$2] /"' _ "$SSH_TIMEOUT" "${hosts[$rank]}" "$(node_command "$rank" "${slots[$rank]}")" &
    pids+=($!)
done
# Wait for every host; the first that fails stops the others (they would wait for it forever).
status=0 running=$NODES
declare -A done_rank=()
while [ "$running" -gt 0 ]; do
    for rank in "${!pids[@]}"; do
        [ -n "${done_rank[$rank]:-}" ] && continue
        kill -0 "${pids[$rank]}" 2>/dev/null && continue
        code=0
        wait "${pids[$rank]}" || code=$?
        done_rank[$rank]=1
        running=$((running - 1))
        if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$code
            echo "error: ${hosts[$rank]} (machine rank $rank) exited with status $code; stopping the others" >&2
            stop_nodes
        fi
    done
    sleep 1 || true  # a Ctrl-C kills the sleep (set -e would end the script with it)
done
finish "$status"
