#!/bin/bash
# Bring up (idempotently) a single-node Slurm with two fake GPUs for the agent's tests, or stop it.
#
#   bash tests/setup/slurm.sh          # start (or reuse) it; prints KEY=VALUE lines
#   bash tests/setup/slurm.sh stop     # stop the daemons it started (by pid file)
#
# Needs root and the packages `slurm-wlm munge` (.ci/run installs them). State lives in
# GPUWATCH_SLURM_DIR (default /tmp/gpuwatch-slurm):
#   slurm.conf, gres.conf          configuration (ports 16817/16818 on 127.0.0.1)
#   fakedev/nvidia{0,1}            character devices 195:{0,1}, the GPUs gres hands out
#   fakegpu/nvidia{0,1}            plain files: a job "uses" GPU i by holding fakegpu/nvidia<i>
#                                  open, which is how `gpuwatch-agent --source fake` sees it
#   jobs/                          the job mapping dir, written by deploy/slurm/{prolog,epilog}.sh
# Output lines: SLURM_CONF=…, GPUWATCH_SLURM_DIR=…, JOB_MAPPING_DIR=…, FAKE_GPU_DIR=…
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
S="${GPUWATCH_SLURM_DIR:-/tmp/gpuwatch-slurm}"
export SLURM_CONF="$S/slurm.conf"

die() { echo "slurm setup: $*" >&2; exit 1; }

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [[ "${1:-start}" == "stop" ]]; then
  for p in "$S/slurmd.pid" "$S/slurmctld.pid"; do
    if alive "$p"; then kill "$(cat "$p")"; fi
  done
  exit 0
fi

for b in slurmctld slurmd sinfo sbatch munged; do
  command -v "$b" >/dev/null || [[ -x "/usr/sbin/$b" ]] ||
    die "$b is missing: install Slurm with \`apt-get install -y slurm-wlm munge\` (see .ci/run)"
done
[[ "$(id -u)" == 0 ]] || die "must run as root (slurmd and the prolog run as root)"

# munge: the package creates /etc/munge/munge.key; start munged once.
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if [[ ! -S /run/munge/munge.socket.2 ]] || ! munge -n </dev/null >/dev/null 2>&1; then
  [[ -f /etc/munge/munge.key ]] || die "/etc/munge/munge.key is missing: reinstall munge"
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null >/dev/null 2>&1 || die "munged did not start: see /var/log/munge/munged.log"
fi

mkdir -p "$S"/{state,spool,log,fakedev,fakegpu,jobs}
for i in 0 1; do
  [[ -c "$S/fakedev/nvidia$i" ]] || mknod "$S/fakedev/nvidia$i" c 195 "$i"
  [[ -f "$S/fakegpu/nvidia$i" ]] || : > "$S/fakegpu/nvidia$i"
done

# Slurm passes no environment of ours to the prolog: wrappers pin the mapping dir.
for kind in prolog epilog; do
  cat > "$S/$kind" <<WRAP
#!/bin/bash
export GPUWATCH_JOB_MAPPING_DIR="$S/jobs"
exec "$ROOT/deploy/slurm/$kind.sh"
WRAP
  chmod 755 "$S/$kind"
done

HOST="$(hostname -s)"
cat > "$S/slurm.conf.new" <<CONF
ClusterName=gpuwatch
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/ctld.log
SlurmdLogFile=$S/log/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
GresTypes=gpu
PrologFlags=Alloc
Prolog=$S/prolog
Epilog=$S/epilog
ReturnToService=2
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
PartitionName=long Nodes=ALL MaxTime=60 State=UP
CONF
echo "NodeName=$HOST Name=gpu File=$S/fakedev/nvidia[0-1]" > "$S/gres.conf"
changed=0
if ! cmp -s "$S/slurm.conf.new" "$S/slurm.conf"; then
  mv "$S/slurm.conf.new" "$S/slurm.conf"
  changed=1
else
  rm -f "$S/slurm.conf.new"
fi
if [[ $changed == 1 ]]; then
  # A new configuration: restart whatever runs on the old one.
  for p in "$S/slurmd.pid" "$S/slurmctld.pid"; do
    if alive "$p"; then kill "$(cat "$p")"; sleep 1; fi
  done
fi

alive "$S/slurmctld.pid" || slurmctld
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
alive "$S/slurmd.pid" || slurmd
state=""
for _ in $(seq 150); do
  state="$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)"
  case "$state" in
    idle*|mixed*|allocated*) break ;;
    down*|drain*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
case "$state" in
  idle*|mixed*|allocated*) ;;
  *) die "node $HOST is '$state', not idle: see $S/log/ctld.log and $S/log/d.log" ;;
esac
echo "SLURM_CONF=$S/slurm.conf"
echo "GPUWATCH_SLURM_DIR=$S"
echo "JOB_MAPPING_DIR=$S/jobs"
echo "FAKE_GPU_DIR=$S/fakegpu"
