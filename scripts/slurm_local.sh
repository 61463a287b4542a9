#!/usr/bin/env bash
# A real Slurm on this machine, for developers and CI: munged, slurmctld and two slurmd
# "nodes" (node1, node2: NodeName aliases of localhost on two ports), each with this
# machine's CPUs. Debian/Ubuntu packages: slurmctld slurmd slurm-client munge (22.05 on
# Debian 12). Needs root (slurmd starts jobs as their users). Idempotent.
#
#   bash scripts/slurm_local.sh install   # apt-get the packages if sbatch is missing
#   bash scripts/slurm_local.sh start     # configure + start (again: no-op when up)
#   export SLURM_CONF=/tmp/rpeg-slurm/slurm.conf   # what `start` prints; sbatch/squeue read it
#   bash scripts/slurm_local.sh status
#   bash scripts/slurm_local.sh stop      # stops the daemons this script started
#
# Everything lives under $RPEG_SLURM_DIR (default /tmp/rpeg-slurm): slurm.conf, state, spool,
# logs, pid files. Nothing under /etc is written (munge uses the key the package created).
# Partition "debug" (default), CPUs only (no GRES), SelectType cons_tres with CR_CPU.
set -euo pipefail

DIR=${RPEG_SLURM_DIR:-/tmp/rpeg-slurm}
CONF=$DIR/slurm.conf
NODES=${RPEG_SLURM_NODES:-2}
# every CPU of the machine (nproc alone honours this shell's CPU affinity: a caller pinned to
# one core, e.g. a test process an earlier in-process run bound, would give the nodes one CPU)
CPUS=${RPEG_SLURM_CPUS:-$(nproc --all)}
export SLURM_CONF=$CONF

die() { echo "slurm_local: $*" >&2; exit 1; }

install() {
  if command -v sbatch >/dev/null && command -v slurmctld >/dev/null \
     && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die "no apt-get: install slurmctld, slurmd, slurm-client, munge yourself"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_up && return 0
  [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key missing (reinstall munge or run mungekey)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge /etc/munge/munge.key
  chmod 0700 /etc/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge_up && return 0; sleep 0.1; done
  die "munged did not answer"
}

write_conf() {
  mkdir -p "$DIR"/{state,log,run}
  local mem names ports
  mem=$(awk '/MemTotal/ {print int($2/1024) - 1024}' /proc/meminfo)
  names=$(seq -s, -f "node%g" 1 "$NODES")
  # one slurmd per node name, each on its own port (17001, 17002, ...)
  cat >"$CONF.tmp" <<EOF
# written by scripts/slurm_local.sh -- a one-machine Slurm for tests
ClusterName=rpeg-local
SlurmctldHost=localhost
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/state/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
InactiveLimit=0
MinJobAge=60
SlurmdTimeout=60
SlurmctldTimeout=30
EOF
  local i=0
  for n in $(seq 1 "$NODES"); do
    echo "NodeName=node$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + n)) CPUs=$CPUS RealMemory=$mem State=UNKNOWN" >>"$CONF.tmp"
    i=$((i + 1))
  done
  echo "PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$CONF.tmp"
  if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.tmp"; then rm -f "$CONF.tmp"; else mv "$CONF.tmp" "$CONF"; fi
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  [ "$(id -u)" = 0 ] || die "needs root (slurmd starts jobs as their users)"
  command -v slurmctld >/dev/null || die "Slurm is not installed: bash $0 install"
  start_munge
  write_conf
  # the daemons on every CPU whatever this shell's affinity (slurmd counts the CPUs it may use)
  local all=()
  command -v taskset >/dev/null && all=(taskset -c "0-$(($(nproc --all) - 1))")
  alive "$DIR/run/slurmctld.pid" || "${all[@]}" slurmctld -f "$CONF"
  for n in $(seq 1 "$NODES"); do
    alive "$DIR/run/slurmd-node$n.pid" || "${all[@]}" slurmd -f "$CONF" -N "node$n"
  done
  # wait until every node is idle (or mixed/allocated: jobs of an earlier session)
  local out=""
  for _ in $(seq 120); do
    out=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
    if [ -n "$out" ] && [ "$(grep -cE ' (idle|mix|alloc)$' <<<"$out")" = "$NODES" ]; then
      echo "slurm_local: up ($NODES nodes x $CPUS CPUs); export SLURM_CONF=$CONF"
      return 0
    fi
    # a node left DOWN by an earlier stop: bring it back
    grep -qE ' (down|drain)' <<<"$out" && scontrol update nodename="$(seq -s, -f 'node%g' 1 "$NODES")" state=resume 2>/dev/null || true
    sleep 0.5
  done
  echo "$out" >&2
  tail -n 20 "$DIR"/log/*.log >&2 || true
  die "nodes not idle after 60 s"
}

stop() {
  # the daemons this script started (their pid files), never by name
  local f
  for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"; do
    [ -e "$f" ] || continue
    if alive "$f"; then
      kill "$(cat "$f")" 2>/dev/null || true
      for _ in $(seq 50); do alive "$f" || break; sleep 0.1; done
    fi
    rm -f "$f"
  done
  echo "slurm_local: stopped (munged left running; its pid: /run/munge/munged.pid)"
}

status() {
  alive "$DIR/run/slurmctld.pid" || { echo "slurm_local: not running"; return 1; }
  sinfo -N
  squeue
}

case "${1:-start}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|stop|status" ;;
esac
