#!/usr/bin/env bash
# A real two-node Slurm / ssh / pdsh cluster on this machine, to rehearse a multi-node launch before
# queueing on a real one (and what the launch tests run on). As root, with Debian's packages:
#   apt-get install slurmctld slurmd slurm-client munge pdsh openssh-server iproute2 procps
#   sudo scripts/dev/cluster.sh up        # ~2 s; prints what to source
#   sudo scripts/dev/cluster.sh down      # stops it all, by recorded PID; removes what `up` added
#   scripts/dev/cluster.sh check          # exit 0 when this machine can build it, else one line why
#   sudo scripts/dev/cluster.sh crash-node fds-node2   # kill everything on a node at once; boot-node: again
#   sudo scripts/dev/cluster.sh clean-nodes  # stop what launches left running on the nodes (by PID)
#
# Each node (fds-node1, fds-node2) is a network + UTS + PID + mount namespace on a bridge (fdsbr0,
# CLUSTER_SUBNET.254 = fds-head): its own address, hostname, process table and loopback, running a real
# sshd and slurmd; slurmctld and munged run on the host side. The filesystem (this checkout, the venv,
# ~/.cache) is shared, as a cluster's shared filesystem is. Why each namespace, and why slurmd is started
# with `nsenter --net` and not `ip netns exec`: docs/cluster.md ("Rehearse a multi-node launch").
#   CLUSTER_DIR       state, configs and logs (default /tmp/framer_ds_cluster; logs in $CLUSTER_DIR/log)
#   CLUSTER_SUBNET    first three octets of the nodes' addresses (default 172.31.77)
#   CLUSTER_LOOPBACK  1 (default): each node's /etc/hosts maps its own name to 127.0.1.1 first, as
#                     Debian's installer writes it; 0: its cluster address only
# `up` adds a marked block to /etc/hosts (fds-head, fds-node1, fds-node2) and an ssh client drop-in
# (/etc/ssh/ssh_config.d/framer_ds_cluster.conf: the cluster's key, no host key prompts); `down` removes
# both. Clients only need SLURM_CONF (source $CLUSTER_DIR/env.sh).
set -euo pipefail

DIR=${CLUSTER_DIR:-/tmp/framer_ds_cluster}
SUBNET=${CLUSTER_SUBNET:-172.31.77}
LOOPBACK=${CLUSTER_LOOPBACK:-1}
NODES=(fds-node1 fds-node2)
HEAD=fds-head
BRIDGE=fdsbr0
HOSTS_BEGIN="# >>> framer_ds cluster ($DIR) >>>"
HOSTS_END="# <<< framer_ds cluster ($DIR) <<<"
SSH_DROPIN=/etc/ssh/ssh_config.d/framer_ds_cluster.conf
# The CLUSTER_DIR of the cluster that is up: the names (namespaces, bridge, ports) are this machine's.
MARKER=/run/framer_ds_cluster.dir
PACKAGES="slurmctld slurmd slurm-client munge pdsh openssh-server iproute2 procps"

say() { echo "[cluster] $*"; }

# Why this machine cannot build the cluster, or nothing: one line.
missing() {
    [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces, a bridge, /etc/hosts)"; return; }
    local tool
    for tool in ip nsenter unshare mount pgrep slurmctld slurmd sbatch munged pdsh sshd ssh ssh-keygen; do
        command -v "$tool" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null 2>&1 || {
            echo "$tool is not installed (apt-get install $PACKAGES)"
            return
        }
    done
    grep -qs '^Include /etc/ssh/ssh_config.d/' /etc/ssh/ssh_config \
        || { echo "/etc/ssh/ssh_config does not include /etc/ssh/ssh_config.d/*.conf"; return; }
    probe_namespaces
}

# What `up` needs from the kernel and the container, tried in miniature in a throw-away namespace: a
# network namespace, a bridge and a veth pair in it, and a node's UTS + PID + mount namespace entered
# with `nsenter --net`, its /proc mounted anew and a file bind-mounted. A container without the
# privileges (CAP_SYS_ADMIN, CAP_NET_ADMIN), a seccomp profile that refuses unshare, or a kernel without
# the bridge or veth drivers is named here, and the tests skip, instead of failing half-way through `up`.
probe_namespaces() {
    local probe="fds-probe-$$" error
    if ! error=$(ip netns add "$probe" 2>&1); then
        echo "cannot create network namespaces here (ip netns add: ${error%%$'\n'*})"
        return
    fi
    if ! error=$(ip -n "$probe" link add fdsprobebr type bridge 2>&1); then
        echo "cannot create a bridge (ip link add type bridge: ${error%%$'\n'*})"
    elif ! error=$(ip -n "$probe" link add fdsprobe1 type veth peer name fdsprobe2 2>&1); then
        echo "cannot create a veth pair (ip link add type veth: ${error%%$'\n'*})"
    elif ! error=$(nsenter --net="/run/netns/$probe" -- unshare --uts --pid --mount-proc --fork -- \
        sh -c 'hostname fds-probe && mount --bind /etc/hosts /etc/hosts' 2>&1); then
        echo "cannot give a node its own hostname, process table and mounts (unshare --uts --pid --mount-proc: ${error%%$'\n'*})"
    fi
    ip netns del "$probe" 2>/dev/null || true
}

# Replace the marked block of FILE with stdin (empty: remove it). In place (cat >), not by rename:
# /etc/hosts is often a bind mount (containers) that a rename cannot replace.
set_block() {
    local file=$1 block kept
    block=$(cat)
    [ -f "$file" ] || : > "$file"
    kept=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0 == b {skip = 1} !skip {print} $0 == e {skip = 0}' "$file")
    if [ -n "$block" ]; then
        printf '%s\n%s\n%s\n%s\n' "$kept" "$HOSTS_BEGIN" "$block" "$HOSTS_END" > "$file"
    else
        printf '%s\n' "$kept" > "$file"
    fi
}

hosts_lines() {
    echo "$SUBNET.254 $HEAD"
    local i
    for i in "${!NODES[@]}"; do echo "$SUBNET.$((i + 1)) ${NODES[$i]}"; done
}

# Started as PID 1 of a node's PID namespace (`up`, below): its hostname, /etc/hosts, sshd and slurmd.
# When it dies the kernel kills everything in the node, which is how `down` stops a node.
node_init() {
    local node=$1
    hostname "$node"
    mount --bind "$DIR/etc/hosts.$node" /etc/hosts
    /usr/sbin/sshd -D -e -f "$DIR/etc/sshd_config.$node" >> "$DIR/log/sshd_$node.log" 2>&1 &
    slurmd -D -f "$DIR/etc/slurm.conf" -N "$node" >> "$DIR/log/slurmd_$node.stdout" 2>&1 &
    wait
}

write_configs() {
    local node i
    mkdir -p "$DIR"/{etc,log,run,munge,ssh,slurm/state} /run/sshd
    chmod 700 "$DIR/munge" "$DIR/ssh"
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
    ssh-keygen -q -t ed25519 -N '' -C framer_ds_cluster -f "$DIR/ssh/id_ed25519"
    ssh-keygen -q -t ed25519 -N '' -C framer_ds_cluster_host -f "$DIR/ssh/host_ed25519_key"
    cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
    for i in "${!NODES[@]}"; do
        node=${NODES[$i]}
        cat > "$DIR/etc/sshd_config.$node" <<EOF
ListenAddress $SUBNET.$((i + 1))
HostKey $DIR/ssh/host_ed25519_key
AuthorizedKeysFile $DIR/ssh/authorized_keys
PidFile $DIR/run/sshd.$node.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
MaxStartups 100
EOF
        {
            echo "127.0.0.1 localhost"
            # Debian's installer maps the machine's own name to 127.0.1.1: gloo then advertises loopback.
            [ "$LOOPBACK" = 1 ] && echo "127.0.1.1 $node"
            hosts_lines
        } > "$DIR/etc/hosts.$node"
    done
    local cpus memory probed
    # What slurmd will find (not `nproc`, which follows OMP_NUM_THREADS).
    probed=$(slurmd -C)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$probed")
    memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<< "$probed")
    # AuthInfo cred_expire: a requeued job is held this long (+1 s) before it may start again; Slurm's
    # default is 120 s. Scheduling every second so a requeued job starts as soon as its hold ends.
    cat > "$DIR/etc/slurm.conf" <<EOF
ClusterName=framerds
SlurmctldHost=$HEAD($SUBNET.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
SlurmdSpoolDir=$DIR/slurm/%n
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmdLogFile=$DIR/log/slurmd_%n.log
StateSaveLocation=$DIR/slurm/state
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdTimeout=20
KillWait=30
MinJobAge=300
FirstJobId=$(( ($(date +%s) % 100000) * 10 ))
NodeName=${NODES[0]} NodeAddr=$SUBNET.1 CPUs=$cpus RealMemory=$memory
NodeName=${NODES[1]} NodeAddr=$SUBNET.2 CPUs=$cpus RealMemory=$memory
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
    printf 'export SLURM_CONF=%q\n' "$DIR/etc/slurm.conf" > "$DIR/env.sh"
}

start_network() {
    local i node
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in "${!NODES[@]}"; do
        node=${NODES[$i]}
        ip netns add "$node"
        ip link add "fdsv$((i + 1))" type veth peer name "fdsp$((i + 1))"
        ip link set "fdsp$((i + 1))" netns "$node"
        ip link set "fdsv$((i + 1))" master "$BRIDGE" up
        ip -n "$node" link set "fdsp$((i + 1))" name eth0
        ip -n "$node" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$node" link set eth0 up
        ip -n "$node" link set lo up
    done
}

# Daemons in the foreground, each PID recorded in $DIR/run/*.pid: `down` stops exactly these.
start_daemons() {
    local node
    munged -F -f --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket.2" \
        --pid-file="$DIR/run/munged.own.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" > /dev/null 2>&1 &
    echo $! > "$DIR/run/munged.pid"
    # slurmctld checks that its own hostname is SlurmctldHost: a UTS namespace of its own says fds-head.
    unshare --uts -- sh -c "hostname $HEAD && exec slurmctld -D -i -f '$DIR/etc/slurm.conf'" \
        >> "$DIR/log/slurmctld.stdout" 2>&1 &
    echo $! > "$DIR/run/slurmctld.pid"
    for node in "${NODES[@]}"; do start_node "$node"; done
}

start_node() {
    # nsenter --net keeps /sys (and /sys/fs/cgroup, which slurmd needs); `ip netns exec` remounts it.
    # --kill-child: when this unshare is killed, its child (the node's PID 1) is, and with it the node.
    nsenter --net="/run/netns/$1" -- unshare --uts --pid --mount-proc --fork --kill-child -- \
        bash "$(readlink -f "$0")" _node_init "$1" >> "$DIR/log/node_$1.log" 2>&1 &
    echo $! > "$DIR/run/node.$1.pid"
}

# SIGKILL to the node's unshare: its child, the node's PID 1, gets SIGKILL, and the kernel kills every
# process of the node (ranks, slurmstepd, slurmd, sshd and its sessions) with it: a node that crashed.
kill_node() {
    [ -f "$DIR/run/node.$1.pid" ] && kill -KILL "$(cat "$DIR/run/node.$1.pid")" 2>/dev/null || true
    rm -f "$DIR/run/node.$1.pid"
}

# The processes on NODE that a launch left there (a test that failed mid-launch, a Ctrl-C'd ssh
# session): every process of the node's PID namespace but its PID 1, its sshd and slurmd (their PIDs in
# the node, from their pid files), slurmstepd (Slurm ends a job's processes itself) and sshd's sessions
# (they end with what they run). "HOSTPID COMMAND" lines.
node_strays() {
    local node=$1 starter init namespace proc keep local_pid
    # The node's PID 1 is the only child of its unshare. No node, nothing: never this machine's own
    # namespace (`pgrep -P 0` would name the machine's PID 1).
    starter=$(cat "$DIR/run/node.$node.pid" 2>/dev/null) && [ "$starter" -gt 1 ] 2>/dev/null || return 0
    init=$(pgrep -P "$starter" | head -n 1)
    [ -n "$init" ] || return 0
    namespace=$(readlink "/proc/$init/ns/pid") || return 0
    [ "$namespace" != "$(readlink /proc/self/ns/pid)" ] || return 0
    keep=" 1 $(cat "$DIR/run/sshd.$node.pid" "$DIR/run/slurmd.$node.pid" 2>/dev/null | tr '\n' ' ') "
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/pid" 2>/dev/null)" = "$namespace" ] || continue
        local_pid=$(awk '/^NSpid:/ {print $NF}' "$proc/status" 2>/dev/null) || continue
        [ -n "$local_pid" ] && [[ $keep != *" $local_pid "* ]] || continue
        [[ $(readlink "$proc/exe" 2>/dev/null) =~ /(slurmstepd|sshd)[^/]*$ ]] && continue
        echo "${proc#/proc/} $(tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | cut -c1-120)"
    done
}

# Stop what launches left on the nodes (node_strays): TERM, so that ranks checkpoint and release
# torch's extension-build lock, then KILL after 20 s. Prints what it stopped.
cmd_clean_nodes() {
    local node pids=() line deadline pid
    for node in "${NODES[@]}"; do
        while read -r line; do
            [ -n "$line" ] || continue
            say "stopping a leftover process on $node: $line"
            pids+=("${line%% *}")
        done < <(node_strays "$node")
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 20))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

wait_ready() {
    local deadline=$((SECONDS + 60)) node idle
    export SLURM_CONF="$DIR/etc/slurm.conf"
    while true; do
        idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$' || true)
        [ "$idle" -eq "${#NODES[@]}" ] && break
        [ $SECONDS -lt $deadline ] || { say "error: the nodes did not come up idle in 60 s (logs: $DIR/log)" >&2; return 1; }
        sleep 0.3
    done
    for node in "${NODES[@]}"; do
        until ssh -o ConnectTimeout=2 "$node" true 2>/dev/null; do
            [ $SECONDS -lt $deadline ] || { say "error: no ssh to $node in 60 s (logs: $DIR/log)" >&2; return 1; }
            sleep 0.3
        done
    done
}

cmd_up() {
    local why other
    why=$(missing)
    [ -z "$why" ] || { say "cannot build the cluster: $why" >&2; exit 2; }
    other=$(cat "$MARKER" 2>/dev/null || true)
    if [ -n "$other" ] && [ "$other" != "$DIR" ]; then
        if [ -f "$other/run/slurmctld.pid" ] && kill -0 "$(cat "$other/run/slurmctld.pid")" 2>/dev/null; then
            say "error: a cluster is up already (CLUSTER_DIR=$other): CLUSTER_DIR=$other $0 down first" >&2
            exit 3
        fi
        CLUSTER_DIR=$other bash "$(readlink -f "$0")" down > /dev/null 2>&1 || true  # a dead one's leftovers
    fi
    cmd_down > /dev/null 2>&1 || true
    echo "$DIR" > "$MARKER"
    write_configs
    hosts_lines | set_block /etc/hosts
    set_block "$SSH_DROPIN" <<EOF
Host $HEAD ${NODES[*]}
    IdentityFile $DIR/ssh/id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
EOF
    start_network
    start_daemons
    if ! wait_ready; then
        tail -n 5 "$DIR"/log/*.log >&2 || true
        cmd_down > /dev/null 2>&1 || true
        exit 1
    fi
    say "up: ${NODES[*]} ($SUBNET.1-${#NODES[@]}), slurmctld on $HEAD ($SUBNET.254); logs in $DIR/log"
    say "source $DIR/env.sh   # SLURM_CONF for sbatch, srun, squeue, scancel, scontrol"
}

# Stop by recorded PID (never by name: other Slurm or sshd daemons on this machine are left alone).
stop_pid_file() {
    local file=$1 pid deadline
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

# Cancel the jobs still there and give their ranks time to stop: a rank SIGKILLed at the wrong moment
# leaves torch's extension-build lock (~/.cache/torch_extensions/.../lock) behind, and every later
# DeepSpeed process on this machine waits for it forever.
drain_jobs() {
    local deadline=$((SECONDS + 45))
    [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null || return 0
    export SLURM_CONF="$DIR/etc/slurm.conf"
    scancel --user="$(id -un)" 2>/dev/null || return 0
    while [ -n "$(squeue -h 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
}

cmd_down() {
    local node i
    drain_jobs
    for node in "${NODES[@]}"; do kill_node "$node"; done
    stop_pid_file "$DIR/run/slurmctld.pid"
    stop_pid_file "$DIR/run/munged.pid"
    for i in "${!NODES[@]}"; do
        ip netns del "${NODES[$i]}" 2>/dev/null || true
        ip link del "fdsv$((i + 1))" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    set_block /etc/hosts < /dev/null
    [ -f "$SSH_DROPIN" ] && rm -f "$SSH_DROPIN"
    [ "$(cat "$MARKER" 2>/dev/null)" = "$DIR" ] && rm -f "$MARKER"
    # Keep the logs of the last cluster; everything else (keys, state) goes.
    rm -rf "${DIR:?}"/{etc,run,munge,ssh,slurm,env.sh}
    say "down"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    check) why=$(missing); [ -z "$why" ] || { echo "$why"; exit 1; } ;;
    # A node that crashes (everything on it killed at once), and the same node booted again.
    crash-node) kill_node "${2:?crash-node NODE}" ;;
    clean-nodes) cmd_clean_nodes ;;
    boot-node) kill_node "${2:?boot-node NODE}"; start_node "$2"; wait_ready ;;
    _node_init) node_init "$2" ;;
    *) echo "usage: $0 up|down|check|crash-node NODE|boot-node NODE|clean-nodes (see the header of $0)" >&2; exit 2 ;;
esac
