#!/usr/bin/env bash
# A real Slurm (22.05, Debian packages) on this one machine, for tests and for trying the
# Slurm path of `gptrain launch`. No systemd needed: daemons are started directly.
#
#   bash scripts/slurm-local.sh up [--nodes N]   install if missing, write slurm.conf, start, wait for idle
#   bash scripts/slurm-local.sh down             stop the daemons started by `up` (by their pid files)
#   bash scripts/slurm-local.sh status           sinfo, or a note that Slurm is not running
#
# The cluster has N emulated nodes n1..nN (default 2) on 127.0.0.1, each declaring this
# machine's CPUs (SlurmdParameters=config_overrides lets them share the real cores), and one
# partition `debug`. `up` is idempotent: a running cluster with the same node count is kept.
set -euo pipefail

NODES=2
CONF=/etc/slurm/slurm.conf
PIDDIR=/run/slurm
STATE=/var/lib/slurm
LOGDIR=/var/log/slurm
PACKAGES=(slurmctld slurmd slurm-client munge)

log() { echo "slurm-local: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "must run as root (installs packages and starts daemons)"
    exit 1
  fi
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v sbatch >/dev/null && command -v munged >/dev/null; then
    return
  fi
  log "installing ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

start_munge() {
  install -d -o munge -g munge -m 0755 /run/munge
  if [ ! -f /etc/munge/munge.key ]; then
    # The package normally creates the key; make one if a minimal install did not.
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  if ! munge -n >/dev/null 2>&1; then
    stop_pidfile /run/munge/munged.pid  # alive but without its socket: restart it
    runuser -u munge -- munged
  fi
}

node_hardware() {
  # `slurmd -C` prints e.g. "NodeName=host CPUs=2 Boards=1 ... RealMemory=24105"; keep the
  # hardware fields, drop its name and UpTime line.
  slurmd -C | head -n1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' \
    | tr '\n' ' '
}

write_conf() {
  local host hw i
  host="$(hostname -s)"
  hw="$(node_hardware)"
  install -d "$(dirname "$CONF")" "$PIDDIR" "$STATE/slurmctld" "$LOGDIR"
  {
    echo "# Written by gptrain scripts/slurm-local.sh: $NODES emulated node(s) on 127.0.0.1."
    cat <<EOF
ClusterName=localcluster
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmctldPidFile=$PIDDIR/slurmctld.pid
SlurmdPidFile=$PIDDIR/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGDIR/jobcomp.log
InactiveLimit=0
KillWait=5
MinJobAge=3600
EOF
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + i)) ${hw}State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running_nodes() { sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l; }

wait_idle() {
  local i
  for i in $(seq 1 100); do
    # every node idle (or mixed/allocated by jobs left from before) and none down
    if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cvE '^(idle|mixed|allocated)$')" = 0 ] \
      && [ "$(running_nodes)" = "$NODES" ]; then
      return 0
    fi
    sleep 0.2
  done
  log "nodes did not become idle; see $LOGDIR/"
  sinfo -N >&2 || true
  return 1
}

up() {
  need_root
  if pid_alive "$PIDDIR/slurmctld.pid" && munge -n >/dev/null 2>&1 && [ "$(running_nodes)" = "$NODES" ] \
    && [ "$(grep -c '^NodeName=' "$CONF" 2>/dev/null)" = "$NODES" ]; then
    local i ok=1
    for i in $(seq 1 "$NODES"); do pid_alive "$PIDDIR/slurmd-n$i.pid" || ok=0; done
    if [ $ok = 1 ]; then
      wait_idle
      log "already up ($NODES node(s))"
      return
    fi
  fi
  down
  install_packages
  start_munge
  write_conf
  local i
  for i in $(seq 1 "$NODES"); do install -d "$STATE/slurmd/n$i"; done
  # -c: start clean, forgetting jobs of an earlier cluster (whose node names may differ)
  slurmctld -c
  for i in $(seq 1 "$NODES"); do slurmd -N "n$i"; done
  wait_idle
  log "up: $NODES node(s), partition debug"
}

stop_pidfile() {
  local file=$1 pid i
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

down() {
  need_root
  local file
  for file in "$PIDDIR"/slurmd-*.pid; do
    [ -e "$file" ] && stop_pidfile "$file"
  done
  stop_pidfile "$PIDDIR/slurmctld.pid"
  stop_pidfile /run/munge/munged.pid
}

status() {
  if timeout 5 sinfo -N 2>/dev/null; then
    return 0
  fi
  echo "slurm-local: not running (bash scripts/slurm-local.sh up)"
  return 1
}

main() {
  local command=${1:-}
  shift || true
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) NODES=$2; shift 2 ;;
      --nodes=*) NODES=${1#--nodes=}; shift ;;
      *) log "unknown option $1"; exit 2 ;;
    esac
  done
  case $command in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up [--nodes N] | down | status" >&2; exit 2 ;;
  esac
}

main "$@"
