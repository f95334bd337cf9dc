#!/usr/bin/env bash
# tbon under a real Slurm (issue #27): sets up a single-node Slurm on this machine (munge,
# slurmctld, slurmd; a minimal configuration in a private folder, ports 16817/16818), runs the
# README's one-command form with `srun --overcommit` for 8 and 32 daemons and with one daemon
# SIGKILLed (srun keeps the other tasks and the tree repairs), with the checks of
# .ci/launchers.sh, then stops every daemon it started.
#
# Usage: bash .ci/slurm.sh     (as root; installs slurm-wlm and munge with apt-get if missing)
#        SLURM_CONF=/etc/slurm/slurm.conf bash .ci/slurm.sh   (use a running Slurm instead)
# Without root and apt-get (or srun), it prints a SKIP line and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

TBON="${TBON:-${CARGO_TARGET_DIR:-target}/release/tbon}"
SIZES="${LAUNCHERS_SIZES:-8 32}"
GUARD_S=120

if [[ ! -x "$TBON" ]]; then
    cargo build --release --bin tbon
fi
TBON="$(cd "$(dirname "$TBON")" && pwd)/$(basename "$TBON")"

started=()
extra_cleanup() {
    local p i j
    # Newest first: slurmd, slurmctld, then munged if this script started it.
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
        p=${started[i]}
        kill -TERM "$p" 2>/dev/null || continue
        for ((j = 0; j < 100; j++)); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$p" 2>/dev/null || true
    done
    [[ -n "${slurm_dir:-}" ]] && rm -rf "$slurm_dir"
}

if [[ -z "${SLURM_CONF:-}" ]]; then
    if [[ "$(id -u)" != 0 ]]; then
        echo "== slurm: SKIP: setting up a Slurm needs root (or set SLURM_CONF to a running one)"
        exit 0
    fi
    if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "== slurm: SKIP: slurm-wlm is not installed and apt-get is unavailable"
            exit 0
        fi
        echo "== slurm: installing slurm-wlm and munge"
        apt-get update >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge >/dev/null
    fi
fi

LABEL=slurm
# shellcheck source=.ci/launch-common.sh
source "$(dirname "$0")/launch-common.sh"

# Waits (hang guard) until "$@" succeeds.
await() {
    local what=$1 i
    shift
    for ((i = 0; i < GUARD_S * 10; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "$what"
}

if [[ -z "${SLURM_CONF:-}" ]]; then
    # munge: the Debian package makes a key; start the daemon as its own user if not running.
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        [[ -s /etc/munge/munge.key ]] || runuser -u munge -- /usr/sbin/mungekey --create 2>/dev/null ||
            (dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null && chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key)
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- /usr/sbin/munged
        started+=("$(cat /run/munge/munged.pid 2>/dev/null || pgrep -u munge -x munged)")
        await "munged did not start" sh -c 'munge -n | unmunge'
    fi
    slurm_dir="$(mktemp -d)"
    mkdir -p "$slurm_dir"/{spool,state,log}
    host="$(hostname)"
    cat >"$slurm_dir/slurm.conf" <<CONF
ClusterName=tbonci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/log/slurmctld.log
SlurmdLogFile=$slurm_dir/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
    export SLURM_CONF="$slurm_dir/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    await "slurmctld did not write its pid file" test -s "$slurm_dir/slurmctld.pid"
    started+=("$(cat "$slurm_dir/slurmctld.pid")")
    slurmd -f "$SLURM_CONF"
    await "slurmd did not write its pid file" test -s "$slurm_dir/slurmd.pid"
    started+=("$(cat "$slurm_dir/slurmd.pid")")
    await "the Slurm node never became idle" sh -c 'sinfo -h -o %T | grep -qx idle'
fi
echo "== slurm: $(srun --version)"

for n in $SIZES; do
    run "srun -n $n --overcommit" "$n" - -- srun -n "$n" --overcommit
done
# One daemon dies: srun keeps the other tasks, and tbon repairs its tree.
run "srun -n 8 --overcommit, rank 5 SIGKILLed" 8 5 -- srun -n 8 --overcommit
echo "== slurm: all ok"
