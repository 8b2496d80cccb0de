#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for trying train.sbatch and for the tests
# in tests/slurm: its own munged, one slurmctld and two slurmd daemons (`slurmd -N n1`,
# `slurmd -N n2`) on 127.0.0.1. Needs root and the Debian packages `slurm-wlm munge`
# (`./dev test` installs them; this script installs nothing).
#
#   slurm/local-cluster.sh up       start it (says so and does nothing if it is already up)
#   slurm/local-cluster.sh down     stop every daemon it started and delete its directory
#   slurm/local-cluster.sh status   sinfo of the cluster (exit 1 when it is not up)
#   slurm/local-cluster.sh env      prints `export SLURM_CONF=...`: eval "$(... env)", then
#                                   sbatch/squeue/scontrol talk to this cluster
#
# Everything it writes (slurm.conf, controller state, spool, logs, munge socket and key) lives
# in one directory: STRATA_SLURM_DIR, default /tmp/strata-slurm. The cluster's name and ports
# are derived from that path, so two clusters in two directories do not collide (and a state
# directory never sees another cluster's name: slurmctld refuses that).
#
# MPI across the two simulated nodes: Open MPI's shared-memory transport crashes when two
# "nodes" are one host, so jobs need OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
# (train.sbatch sets them when it runs here; `env` prints them too).
set -euo pipefail

DIR=${STRATA_SLURM_DIR:-/tmp/strata-slurm}
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
DIR=${DIR%/}
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket

die() { echo "local-cluster: error: $*" >&2; exit 1; }
say() { echo "local-cluster: $*"; }

# Ports and name from the directory, so clusters in different directories can run side by side.
hash=$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)
CTLD_PORT=$((20000 + (hash % 2000) * 4))   # slurmctld; slurmd ports are the next two
N1_PORT=$((CTLD_PORT + 1))
N2_PORT=$((CTLD_PORT + 2))
CLUSTER=strata$((hash % 100000))
# Job ids from the directory too: scripts that find a job's processes by SLURM_JOB_ID in their
# environment (the tests, bench_goodput.py) must not find another cluster's job of that id.
FIRST_JOB_ID=$((1 + (hash % 2000) * 30000))

need_tools() {
  local t missing=()
  for t in munged slurmctld slurmd sinfo scontrol; do
    command -v "$t" >/dev/null 2>&1 || [ -x "/usr/sbin/$t" ] || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] ||
    die "${missing[*]} not found: install the Debian packages 'slurm-wlm munge' (./dev test does)"
  [ "$(id -u)" -eq 0 ] || die "must run as root (the daemons run as root here)"
  [ ${#MUNGE_SOCKET} -lt 100 ] || die "STRATA_SLURM_DIR too long for a unix socket path: $DIR"
}

export PATH=$PATH:/usr/sbin:/sbin
export SLURM_CONF=$CONF

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

is_up() {
  [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd-n1.pid" &&
    pid_alive "$DIR/run/slurmd-n2.pid" && pid_alive "$DIR/munge/munged.pid"
}

write_conf() {
  local host
  host=$(hostname -s)
  cat >"$CONF" <<EOF
# Written by slurm/local-cluster.sh: a two-node cluster on one host, for tests.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
FirstJobId=$FIRST_JOB_ID
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Fault tolerance: --requeue jobs go back to the queue when a node fails or on
# 'scontrol requeue'; a node that was down comes back as soon as its slurmd registers.
JobRequeue=1
ReturnToService=2
# Fast turnaround for tests: finished jobs stay visible 30 s (enough to read their state),
# the scheduler looks at the queue every second, nodes not answering are down after 10 s.
MinJobAge=30
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,defer_batch=0
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Port=$N1_PORT-$N2_PORT State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

start_munge() {
  mkdir -p "$DIR/munge"
  if [ -s /etc/munge/munge.key ]; then
    cp /etc/munge/munge.key "$DIR/munge/munge.key"
  else
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chown -R munge:munge "$DIR/munge"
  chmod 755 "$DIR/munge"
  chmod 400 "$DIR/munge/munge.key"
  su -s /bin/sh munge -c "munged --socket=$MUNGE_SOCKET --key-file=$DIR/munge/munge.key \
      --pid-file=$DIR/munge/munged.pid --log-file=$DIR/munge/munged.log \
      --seed-file=$DIR/munge/munged.seed" ||
    die "munged did not start (see $DIR/munge/munged.log)"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2
  shift 2
  local i
  for ((i = 0; i < secs * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  die "$what did not come up within ${secs}s (logs in $DIR/log)"
}

nodes_idle() {
  local states
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [ "$(grep -cE '^n[12] (idle|mix|alloc)' <<<"$states")" -eq 2 ]
}

up() {
  need_tools
  if is_up; then
    say "already up in $DIR (cluster $CLUSTER)"
    return 0
  fi
  # Half-started or stale: start from a clean directory.
  [ -d "$DIR" ] && down_quiet
  mkdir -p "$DIR"/{etc,state,log,run,spool/n1,spool/n2,tmp/n1,tmp/n2}
  chmod 755 "$DIR"
  chmod 755 "$DIR/log"
  write_conf
  start_munge
  wait_for 10 munged test -S "$MUNGE_SOCKET"
  slurmctld -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
  wait_for 20 slurmctld scontrol ping
  slurmd -f "$CONF" -N n1 || die "slurmd n1 did not start (see $DIR/log/slurmd-n1.log)"
  slurmd -f "$CONF" -N n2 || die "slurmd n2 did not start (see $DIR/log/slurmd-n2.log)"
  # Nodes left down by an earlier life of this state dir come back with ReturnToService=2.
  wait_for 30 "nodes n1 and n2" nodes_idle
  say "up in $DIR (cluster $CLUSTER, slurmctld port $CTLD_PORT)"
  say "use it with: export SLURM_CONF=$CONF"
}

stop_daemons() {  # TERM every daemon with a pid file, KILL what is left after 5 s
  local f pid pids=() i
  for f in "$DIR"/run/slurmd-n1.pid "$DIR"/run/slurmd-n2.pid "$DIR"/run/slurmctld.pid \
           "$DIR"/munge/munged.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for ((i = 0; i < 20; i++)); do
    local alive=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    pids=("${alive[@]}")
    [ ${#pids[@]} -eq 0 ] && return 0
    sleep 0.25
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

down_quiet() {
  # Cancel jobs first, so their steps (slurmstepd and the ranks) end with them.
  if [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid"; then
    scancel --quiet --user=root 2>/dev/null || true
    sleep 0.5
  fi
  stop_daemons
  # Step daemons of this cluster that outlived their slurmd (they run from its spool dir).
  local pid
  for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if grep -qs "$DIR/" "/proc/$pid/environ" ||
       tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$DIR/"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$DIR"
}

down() {
  if [ ! -d "$DIR" ]; then
    say "not up ($DIR does not exist)"
    return 0
  fi
  down_quiet
  say "down; removed $DIR"
}

status() {
  if ! is_up; then
    say "not up (no running daemons for $DIR)"
    return 1
  fi
  say "up in $DIR (cluster $CLUSTER); SLURM_CONF=$CONF"
  sinfo -N -o '%N %P %t %c %E'
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env)
    printf 'export SLURM_CONF=%q\n' "$CONF"  # quoted for eval: the directory is the user's
    echo "export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo"
    ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
