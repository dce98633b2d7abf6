#!/usr/bin/env bash
# A single-node Slurm on localhost for the `slurm` tests: munged + slurmctld + slurmd, no systemd.
#   scripts/slurm-ci.sh up       start the three daemons (idempotent); waits until the node is idle
#   scripts/slurm-ci.sh down     cancel every job, then stop slurmd, slurmctld and munged
#   scripts/slurm-ci.sh status   show what runs
# Needs root and the Debian packages slurmctld slurmd slurm-client munge (system-packages.txt).
# Settings (environment): SLURM_CI_DIR (state, spool, logs; default /tmp/carls-slurm),
#   SLURM_CI_PARTITION (default debug), SLURM_CI_CPUS (CPUs the node advertises; default: nproc,
#   may exceed it thanks to config_overrides).
set -euo pipefail

STATE_DIR=${SLURM_CI_DIR:-/tmp/carls-slurm}
PARTITION=${SLURM_CI_PARTITION:-debug}
NODE=$(hostname -s)
CPUS=${SLURM_CI_CPUS:-$(nproc)}
CONF=/etc/slurm/slurm.conf          # the default path, so sbatch/squeue/scancel need no SLURM_CONF
MUNGE_PIDFILE=/run/munge/munged.pid

say() { printf '[slurm-ci] %s\n' "$*" >&2; }

# A pid counts as running unless it is gone or a zombie (kill -0 succeeds on zombies).
running() {
  [[ -n ${1:-} ]] || return 1
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $stat && $stat != Z* ]]
}
pidfile_pid() { [[ -s $1 ]] && cat "$1" || true; }

stop_daemon() {  # stop_daemon NAME PIDFILE
  local pid
  pid=$(pidfile_pid "$2")
  if running "$pid"; then
    say "stopping $1 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 50); do running "$pid" || break; sleep 0.2; done
    if running "$pid"; then say "$1 ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$2"
}

have_packages() {
  [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/sbin/munged ]] && command -v sbatch >/dev/null
}

write_config() {
  local mem_mb
  # RealMemory must not exceed what slurmd detects; 80 % of MemTotal leaves room
  mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
  mkdir -p /etc/slurm "$STATE_DIR/state" "$STATE_DIR/spool" "$STATE_DIR/log"
  rm -rf "${STATE_DIR:?}/state/"* "${STATE_DIR:?}/spool/"*
  cat >"$CONF" <<CONF
# Written by carls-dask scripts/slurm-ci.sh: a one-node test cluster on localhost.
ClusterName=carls-ci
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=${STATE_DIR}/state
SlurmdSpoolDir=${STATE_DIR}/spool
SlurmctldPidFile=${STATE_DIR}/slurmctld.pid
SlurmdPidFile=${STATE_DIR}/slurmd.pid
SlurmctldLogFile=${STATE_DIR}/log/slurmctld.log
SlurmdLogFile=${STATE_DIR}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=${PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
  if running "$(pidfile_pid $MUNGE_PIDFILE)"; then return 0; fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  munge -n | unmunge >/dev/null
}

wait_for_node() {
  local i state=""
  for i in $(seq 150); do
    state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
    case $state in
      idle* | mix* | alloc*) return 0 ;;
      down* | drain* | drng*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  say "node $NODE did not become idle (state: ${state:-no answer}); last log lines:"
  tail -n 20 "$STATE_DIR/log/slurmctld.log" "$STATE_DIR/log/slurmd.log" >&2 || true
  return 1
}

up() {
  [[ $(id -u) -eq 0 ]] || { say "must run as root"; return 1; }
  have_packages || { say "slurm/munge packages missing (see system-packages.txt)"; return 1; }
  if running "$(pidfile_pid "$STATE_DIR/slurmctld.pid")" && running "$(pidfile_pid "$STATE_DIR/slurmd.pid")"; then
    wait_for_node
    return 0
  fi
  # a half-started cluster is cleaned first
  stop_daemon slurmd "$STATE_DIR/slurmd.pid"
  stop_daemon slurmctld "$STATE_DIR/slurmctld.pid"
  write_config
  start_munge
  /usr/sbin/slurmctld
  /usr/sbin/slurmd
  wait_for_node
  say "up: node $NODE, partition $PARTITION, $CPUS CPUs"
}

down() {
  if running "$(pidfile_pid "$STATE_DIR/slurmctld.pid")"; then
    # job steps outlive slurmd: cancel the jobs first and wait for the queue to drain
    scancel --partition="$PARTITION" >/dev/null 2>&1 || true
    local i
    for i in $(seq 100); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  stop_daemon slurmd "$STATE_DIR/slurmd.pid"
  stop_daemon slurmctld "$STATE_DIR/slurmctld.pid"
  stop_daemon munged "$MUNGE_PIDFILE"
}

status() {
  local name pid
  for name in slurmctld slurmd; do
    pid=$(pidfile_pid "$STATE_DIR/$name.pid")
    if running "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: stopped"; fi
  done
  pid=$(pidfile_pid $MUNGE_PIDFILE)
  if running "$pid"; then echo "munged: running (pid $pid)"; else echo "munged: stopped"; fi
  if running "$(pidfile_pid "$STATE_DIR/slurmctld.pid")"; then sinfo; squeue; fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
