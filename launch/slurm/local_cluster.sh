#!/usr/bin/env bash
# Start or stop a throw-away single-node Slurm cluster on this machine, for testing the job scripts.
#
#   launch/slurm/local_cluster.sh install          # apt-get install slurm-wlm munge (root; idempotent)
#   launch/slurm/local_cluster.sh start STATE_DIR  # munged + slurmctld + slurmd, waits until the node is idle
#   eval "$(launch/slurm/local_cluster.sh env STATE_DIR)"   # point sbatch / squeue / sinfo at it
#   launch/slurm/local_cluster.sh stop STATE_DIR   # stops exactly the daemons that `start` launched
#
# Everything (config, munge key and socket, spool and state dirs, logs, pid files) lives under STATE_DIR, so
# the cluster does not touch /etc/slurm or a system munged. It runs as root: ProctrackType=proctrack/linuxproc
# and TaskPlugin=task/none because containers and CI runners usually lack a writable cgroup hierarchy.
# Settings: LOCAL_SLURM_CPUS (CPUs of the node, default 2), LOCAL_SLURM_PORT (slurmctld port; slurmd uses the
# next one; default 6817), LOCAL_SLURM_TIMEOUT (seconds to wait for the node, default 60).
set -euo pipefail

usage() {
    echo "usage: $0 install | start STATE_DIR | env STATE_DIR | stop STATE_DIR" >&2
    exit 2
}

install_slurm() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "installing slurm-wlm and munge needs root" >&2
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
    local state=$1 host cpus port
    host=$(hostname -s)
    cpus=${LOCAL_SLURM_CPUS:-2}
    port=${LOCAL_SLURM_PORT:-6817}
    mkdir -p "$state"/{munge,spool,ctld,log,run}
    # munged refuses a socket directory or key that others can write or read.
    chmod 700 "$state/munge"
    if [ ! -f "$state/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$state/munge/munge.key"
        chmod 400 "$state/munge/munge.key"
    fi
    cat >"$state/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${port}
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=${state}/munge/munge.socket
CredType=cred/munge
StateSaveLocation=${state}/ctld
SlurmdSpoolDir=${state}/spool
SlurmctldPidFile=${state}/run/slurmctld.pid
SlurmdPidFile=${state}/run/slurmd.pid
SlurmctldLogFile=${state}/log/slurmctld.log
SlurmdLogFile=${state}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${state}/log/jobcomp.txt
ReturnToService=2
# Finished jobs stay visible to scontrol for this long, so their exit code can be read without accounting.
MinJobAge=600
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} State=UNKNOWN
PartitionName=local Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
}

print_env() {
    local state=$1
    echo "export SLURM_CONF=${state}/slurm.conf"
}

node_state() {
    SLURM_CONF="$1/slurm.conf" sinfo -h -N -o '%t' 2>/dev/null | head -n1
}

start_cluster() {
    local state timeout waited
    state=$(realpath -m "$1")
    timeout=${LOCAL_SLURM_TIMEOUT:-60}
    if [ "$(id -u)" -ne 0 ]; then
        echo "the local test cluster runs its daemons as root" >&2
        return 1
    fi
    write_config "$state"
    export SLURM_CONF="$state/slurm.conf"
    munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
        --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" --seed-file="$state/munge/seed"
    # -c: ignore saved state from an earlier start in the same directory.
    slurmctld -c -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    waited=0
    until [ "$(node_state "$state")" = "idle" ]; do
        if [ "$waited" -ge "$timeout" ]; then
            echo "node not idle after ${timeout}s (state: $(node_state "$state")); logs in $state/log" >&2
            tail -n 20 "$state"/log/*.log >&2 || true
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    echo "local slurm cluster up: $(hostname -s), ${LOCAL_SLURM_CPUS:-2} CPUs, config $SLURM_CONF"
}

stop_pid_file() {
    local pid_file=$1 pid i
    [ -f "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    if kill "$pid" 2>/dev/null; then
        for i in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

stop_cluster() {
    local state
    state=$(realpath -m "$1")
    # Cancel what is still queued or running, so slurmd does not leave job steps behind.
    if [ -f "$state/slurm.conf" ] && [ -f "$state/run/slurmctld.pid" ]; then
        SLURM_CONF="$state/slurm.conf" timeout 10 scancel --user=root 2>/dev/null || true
    fi
    stop_pid_file "$state/run/slurmd.pid"
    stop_pid_file "$state/run/slurmctld.pid"
    stop_pid_file "$state/run/munged.pid"
}

case "${1:-}" in
    install) install_slurm ;;
    start) [ $# -eq 2 ] || usage; start_cluster "$2" ;;
    env) [ $# -eq 2 ] || usage; print_env "$(realpath -m "$2")" ;;
    stop) [ $# -eq 2 ] || usage; stop_cluster "$2" ;;
    *) usage ;;
esac
