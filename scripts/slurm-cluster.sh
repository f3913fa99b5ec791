#!/usr/bin/env bash
# A real Slurm cluster on this machine for the hub's tests and demo: munge, slurmctld and
# NODES slurmd compute nodes (default 2), each node in a network namespace of its own, with
# 2 stand-in GPUs per node (GresTypes=gpu, gres.conf), cgroup.conf constraining devices,
# cores and RAM (ConstrainDevices, ConstrainCores, ConstrainRAMSpace; CR_Core_Memory), and
# PrivateData (slurm.conf and slurmdbd.conf: members see only their own jobs).
#
#   scripts/slurm-cluster.sh start    # idempotent: leaves a healthy cluster alone
#   scripts/slurm-cluster.sh stop     # cancels every job, stops the daemons, kills what
#                                     # is left in the nodes' namespaces (slurmstepd, the
#                                     # jobs' bubblewrap and servers), removes namespaces
#                                     # and bridge
#   scripts/slurm-cluster.sh status   # exit 0 when every node is up (sinfo)
#   scripts/slurm-cluster.sh env      # prints SLURM_CONF=... for the Slurm commands
#   scripts/slurm-cluster.sh login-env
#                                     # prints the hub's settings for the submit host:
#                                     # GPUHUB_SLURM_SUBMIT_HOST, _SSH_OPTIONS and _CONF
#   scripts/slurm-cluster.sh image gpuhub/base:latest
#                                     # unpacks a local Docker image for the nodes'
#                                     # container runtime: DIR/images/gpuhub_base_latest/rootfs
#                                     # and its labels beside it, labels.json
#                                     # (kept while the image id is the same)
#
# Why namespaces: Debian's slurm-wlm 22.05 *is* built with multiple-slurmd mode
# (`scontrol show config` says MULTIPLE_SLURMD = Yes, `slurmd -N <node>` picks the node, and
# each slurmd's cgroups live under slurm_<node>/), which would let the nodes share 127.0.0.1
# with a Port= each.  We give each slurmd a network namespace of its own instead
# (NS_PREFIX<node>, a veth pair on the bridge BRIDGE), so that each node has an address of its
# own, as real hosts do, and every node's notebook server can use the same port range.  The
# addresses (SUBNET.0/24) exist only on that bridge and in these namespaces; nothing else on
# the network is reached.  slurmd is started with nsenter --net, keeping the host's mounts
# (`ip netns exec` remounts /sys and would hide /sys/fs/cgroup).
#
# Accounting: slurmdbd (Slurm's accounting daemon) with MariaDB, both on the controller's
# host: MariaDB on 127.0.0.1:PORT+3 with its data in DIR/mysql, slurmdbd on PORT+2, and
# slurm.conf AccountingStorageTRES=gres/gpu so that each job's record keeps its GPUs
# (`sacct -o AllocTRES`, which `gpuhub usage` reads).  GPUHUB_SLURM_DBD=no starts the
# cluster without it (AccountingStorageType=accounting_storage/none), as a site without
# accounting runs.
#
# GPUs without a GPU: each node's GPUs are character devices with NVIDIA's major number 195
# (mknod c 195 N) under DIR/dev/<node>/; opening one gives ENXIO (no driver), while a device
# the job was not given gives EPERM when the devices cgroup constrains it.
#
# The submit host: a network namespace of its own (NS_PREFIXlogin, SUBNET.20) running a real
# OpenSSH sshd (Debian openssh-server) with its own host key and one authorized key, the
# hub's (DIR/login/hub_key), both made here; what a site's login node is to the hub.  Its
# Slurm client finds the cluster at DIR/login/slurm/slurm.conf, which exists only in the
# login host's own mount namespace (DIR bound there), so a command that passes for the
# hub's without going through ssh finds no cluster.  munge's socket is a file under DIR,
# which the login host sees as every node does.  `start` starts it (when sshd is installed);
# `login-stop` and `login-start` take its sshd down and up, `login-freeze` and `login-thaw`
# stop and continue every process of it (a host that no longer answers): the hub's fault
# tests.
#
# Settings (environment): GPUHUB_SLURM_DIR (default /srv/gpuhub-slurm: configuration, state,
# logs, devices, and the shared storage DIR/shared that every node sees),
# GPUHUB_SLURM_NODES (2), GPUHUB_SLURM_NODE_MEMORY (each node's RealMemory in MB; default: the
# machine's memory divided among the nodes), GPUHUB_SLURM_DBD (yes: accounting; no: none),
# GPUHUB_SLURM_SUBNET (10.215.15), GPUHUB_SLURM_PORT (6817; slurmd, slurmdbd and MariaDB +1..3),
# GPUHUB_SLURM_SCHEDULER_PARAMETERS (see deploy/slurm/slurm.conf.in; bf_interval=30 gives
# Slurm's own defaults, for comparison).  A second cluster beside the first (another
# checkout's tests) needs its own DIR, SUBNET and PORT, and names of its own for the bridge,
# the namespaces and the veth pairs: GPUHUB_SLURM_BRIDGE (ghslurm0), GPUHUB_SLURM_NS_PREFIX
# (ghslurm-), GPUHUB_SLURM_VETH (ghs; at most 9 characters).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=${GPUHUB_SLURM_DIR:-/srv/gpuhub-slurm}
NODES=${GPUHUB_SLURM_NODES:-2}
SUBNET=${GPUHUB_SLURM_SUBNET:-10.215.15}
CTL_PORT=${GPUHUB_SLURM_PORT:-6817}
SLURMD_PORT=$((CTL_PORT + 1))
DBD_PORT=$((CTL_PORT + 2))
DB_PORT=$((CTL_PORT + 3))
DBD=${GPUHUB_SLURM_DBD:-yes}
SCHED=${GPUHUB_SLURM_SCHEDULER_PARAMETERS:-sched_min_interval=0,batch_sched_delay=0,bf_interval=5}
BRIDGE=${GPUHUB_SLURM_BRIDGE:-ghslurm0}
NS_PREFIX=${GPUHUB_SLURM_NS_PREFIX:-ghslurm-}
VETH=${GPUHUB_SLURM_VETH:-ghs}
NODE_PREFIX=node
CTL_ADDR=$SUBNET.1
LOGIN_NS=${NS_PREFIX}login
LOGIN_ADDR=$SUBNET.20
SSHD=/usr/sbin/sshd
GPUS_PER_NODE=2
# each node claims the machine's own CPUs (cgroup.conf ConstrainCores pins jobs to them)
NODE_CPUS=$(nproc)
# and an equal part of the machine's memory (slurm.conf config_overrides lets them claim
# it), so that a node takes a GPU server per GPU and CPU servers beside them with the limits
# the hub derives from it (hub_ext/common/limits.py)
NODE_MEMORY=${GPUHUB_SLURM_NODE_MEMORY:-$(( $(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo) / NODES ))}
DEF_MEM_PER_CPU=1024
export SLURM_CONF=$DIR/slurm.conf

say() { printf 'slurm-cluster: %s\n' "$*" >&2; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }

cgroup_mode() {
  # v1 with the devices controller: Slurm's cgroup/v1 plugin constrains devices.
  if [ -d /sys/fs/cgroup/devices ] && [ -w /sys/fs/cgroup/devices ]; then
    echo v1
  elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo v2
  else
    echo none
  fi
}

render() {  # template -> file, replacing @KEY@ by the values given as KEY=value
  local src=$1 dst=$2; shift 2
  local text; text=$(cat "$src")
  for kv in "$@"; do text=${text//@${kv%%=*}@/${kv#*=}}; done
  printf '%s\n' "$text" >"$dst"
}

write_config() {
  mkdir -p "$DIR"/{munge,state,spool,run,log,dev,shared}
  chmod 0755 "$DIR" "$DIR/shared"
  chmod 0700 "$DIR/munge"
  local nodes="" list="" gres=""
  for i in $(seq 1 "$NODES"); do
    local n=$NODE_PREFIX$i
    nodes+="NodeName=$n NodeAddr=$(node_addr "$i") NodeHostname=$n CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY Gres=gpu:$GPUS_PER_NODE State=UNKNOWN"$'\n'
    list+="${list:+,}$n"
    mkdir -p "$DIR/dev/$n"
    for g in $(seq 0 $((GPUS_PER_NODE - 1))); do
      local minor=$(( (i - 1) * GPUS_PER_NODE + g ))
      [ -c "$DIR/dev/$n/nvidia$g" ] || mknod -m 0666 "$DIR/dev/$n/nvidia$g" c 195 "$minor"
    done
    gres+="NodeName=$n Name=gpu File=$DIR/dev/$n/nvidia[0-$((GPUS_PER_NODE - 1))]"$'\n'
  done
  # the jobs' outbound traffic (GPUHUB_SLURM_OUTBOUND: slirp4netns, pasta) opens /dev/net/tun
  # as the member, which Debian's own mode (0666) allows; some machines ship it 0600
  if [ -c /dev/net/tun ]; then chmod 0666 /dev/net/tun; fi
  local mode proctrack task cgplugin constrain
  mode=$(cgroup_mode)
  case $mode in
    v1) proctrack=proctrack/cgroup task=task/cgroup cgplugin=cgroup/v1 constrain=yes ;;
    v2) proctrack=proctrack/cgroup task=task/cgroup cgplugin=cgroup/v2 constrain=yes ;;
    *) proctrack=proctrack/linuxproc task=task/none cgplugin=autodetect constrain=no
       say "no cgroup devices controller here: GPUs are handed out but not fenced" ;;
  esac
  local accounting="AccountingStorageType=accounting_storage/none"
  if [ "$DBD" = yes ]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_ADDR
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageTRES=gres/gpu"
    mkdir -p "$DIR/mysql"
    [ -s "$DIR/mysql/slurm.pass" ] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$DIR/mysql/slurm.pass")
    (umask 077; render deploy/slurm/slurmdbd.conf.in "$DIR/slurmdbd.conf" \
      "DIR=$DIR" "CTL_HOST=$(hostname -s)" "DBD_PORT=$DBD_PORT" "DB_PORT=$DB_PORT" \
      "DB_PASS=$(cat "$DIR/mysql/slurm.pass")")
  fi
  render deploy/slurm/slurm.conf.in "$DIR/slurm.conf" \
    "DIR=$DIR" "CTL_HOST=$(hostname -s)" "CTL_ADDR=$CTL_ADDR" "CTL_PORT=$CTL_PORT" \
    "SLURMD_PORT=$SLURMD_PORT" "PROCTRACK=$proctrack" "TASK_PLUGIN=$task" \
    "SCHEDULER_PARAMETERS=$SCHED" "SLURMD_TIMEOUT=${GPUHUB_SLURMD_TIMEOUT:-30}" \
    "NODE_PREFIX=$NODE_PREFIX" "NODES=${nodes%$'\n'}" "NODE_LIST=$list" \
    "NODE_CPUS=$NODE_CPUS" "DEF_MEM_PER_CPU=$DEF_MEM_PER_CPU" \
    "ACCOUNTING=$accounting"
  render deploy/slurm/cgroup.conf.in "$DIR/cgroup.conf" \
    "CGROUP_PLUGIN=$cgplugin" "CONSTRAIN_DEVICES=$constrain"
  printf '%s' "$gres" >"$DIR/gres.conf"
  : >"$DIR/plugstack.conf"
  echo "$mode" >"$DIR/cgroup-mode"
}

start_munge() {
  # clients (sbatch as a member) reach the socket: its directory needs x for all (also
  # when munged already runs: write_config made the directory 0700)
  chmod 0711 "$DIR/munge"
  if [ -S "$DIR/munge/munge.socket" ] && munge -n -S "$DIR/munge/munge.socket" >/dev/null 2>&1; then
    return
  fi
  [ -s "$DIR/munge/munge.key" ] || { dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" 2>/dev/null; chmod 0400 "$DIR/munge/munge.key"; }
  rm -f "$DIR/munge/munge.socket"*
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
}

setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  for i in $(seq 1 "$NODES"); do
    local ns=$NS_PREFIX$NODE_PREFIX$i host=$VETH-h$i peer=$VETH-n$i
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    if ! ip link show "$host" >/dev/null 2>&1; then
      ip link add "$host" type veth peer name "$peer"
      ip link set "$peer" netns "$ns"
      ip link set "$host" master "$BRIDGE" up
      ip netns exec "$ns" ip addr add "$(node_addr "$i")/24" dev "$peer"
      ip netns exec "$ns" ip link set "$peer" up
      ip netns exec "$ns" ip link set lo up
      ip netns exec "$ns" ip route add default via "$CTL_ADDR"
    fi
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

login_files() {  # the login host's keys and sshd configuration (kept once made)
  local d=$DIR/login
  mkdir -p "$d/slurm"
  chmod 0755 "$d" "$d/slurm"
  [ -s "$d/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C gpuhub-login -f "$d/ssh_host_ed25519_key"
  [ -s "$d/hub_key" ] || ssh-keygen -q -t ed25519 -N '' -C gpuhub-hub -f "$d/hub_key"
  # the hub's key may run commands only: no forwarding, no terminal
  echo "restrict $(cat "$d/hub_key.pub")" >"$d/authorized_keys"
  echo "$LOGIN_ADDR $(cut -d' ' -f1-2 "$d/ssh_host_ed25519_key.pub")" >"$d/known_hosts"
  chmod 0644 "$d/authorized_keys" "$d/known_hosts"
  cat >"$d/sshd_config" <<CONF
ListenAddress $LOGIN_ADDR
HostKey $d/ssh_host_ed25519_key
PidFile $DIR/run/sshd-login.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
# the hub multiplexes its commands over one connection (ControlMaster): sessions at once
MaxSessions 64
MaxStartups 64:30:128
CONF
}

setup_login_network() {
  local host=$VETH-hl peer=$VETH-nl
  ip netns list | grep -qw "$LOGIN_NS" || ip netns add "$LOGIN_NS"
  if ! ip link show "$host" >/dev/null 2>&1; then
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$LOGIN_NS"
    ip netns exec "$LOGIN_NS" ip addr add "$LOGIN_ADDR/24" dev "$peer"
    ip netns exec "$LOGIN_NS" ip link set "$peer" up
    ip netns exec "$LOGIN_NS" ip link set lo up
    ip netns exec "$LOGIN_NS" ip route add default via "$CTL_ADDR"
  fi
  ip link set "$host" master "$BRIDGE" up  # again after a bridge made anew
}

login_start() {
  if [ ! -x "$SSHD" ]; then
    # the demo (setup.sh --for slurm) needs none: its hub submits on this machine
    say "no submit host (sshd is not installed): the hub submits on this machine, as the demo does; the submit-host tests need one (scripts/setup.sh --for tests, or apt-get install openssh-server)"
    return
  fi
  login_files
  setup_login_network
  pid_alive "$DIR/run/sshd-login.pid" && return
  mkdir -p /run/sshd && chmod 0755 /run/sshd  # sshd's privilege separation folder
  # a mount namespace of its own, where DIR/login/slurm is DIR (only the login host sees
  # the cluster's configuration there) and root's home is its own, empty: the sessions do
  # not run this machine's ~/.bashrc (whose tools keep locks a killed session leaves)
  unshare --mount --propagation private sh -c \
    'mount --bind "$1" "$1/login/slurm" && mount -t tmpfs -o mode=0700 gpuhub-login-root /root && exec nsenter --net="/run/netns/$2" "$3" -f "$1/login/sshd_config" -E "$1/log/sshd-login.log"' \
    sh "$DIR" "$LOGIN_NS" "$SSHD"
  for _ in $(seq 1 50); do pid_alive "$DIR/run/sshd-login.pid" && break; sleep 0.1; done
  pid_alive "$DIR/run/sshd-login.pid" || { say "the submit host's sshd did not start:"; tail -n 20 "$DIR/log/sshd-login.log" >&2; exit 1; }
  say "submit host up: root@$LOGIN_ADDR (sshd, $DIR/login)"
}

login_stop() {  # sshd and every session it runs (the hub's shared connection too)
  local pids
  pids=$(ip netns pids "$LOGIN_NS" 2>/dev/null || true)
  if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; fi
  rm -f "$DIR/run/sshd-login.pid"
}

login_env() {
  echo "GPUHUB_SLURM_SUBMIT_HOST=root@$LOGIN_ADDR"
  echo "GPUHUB_SLURM_SSH_OPTIONS=-i $DIR/login/hub_key -o IdentitiesOnly=yes -o UserKnownHostsFile=$DIR/login/known_hosts -o StrictHostKeyChecking=yes"
  echo "GPUHUB_SLURM_CONF=$DIR/login/slurm/slurm.conf"
}

wait_for() {  # wait_for WHAT LOG COMMAND...: up to 60 s for COMMAND to succeed
  local what=$1 log=$2; shift 2
  local deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
  say "$what did not start:"; tail -n 20 "$log" >&2; exit 1
}

start_accounting() {  # MariaDB, then slurmdbd, then the cluster's row in its database
  local db=$DIR/mysql sock=$DIR/mysql/mysqld.sock
  if ! pid_alive "$DIR/mysql/mariadb.pid"; then
    if [ ! -d "$db/data/mysql" ]; then
      mkdir -p "$db/data"; chown mysql:mysql "$db/data"
      mariadb-install-db --user=mysql --datadir="$db/data" --skip-test-db \
        --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1
    fi
    chown mysql:mysql "$db"
    # Slurm's accounting guide: InnoDB with a long lock wait (its schema changes are long)
    setsid mariadbd --no-defaults --user=mysql --datadir="$db/data" --socket="$sock" \
      --bind-address=127.0.0.1 --port="$DB_PORT" --pid-file="$DIR/mysql/mariadb.pid" \
      --log-error="$db/mariadb.log" --skip-name-resolve --innodb-buffer-pool-size=64M \
      --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
    wait_for MariaDB "$db/mariadb.log" mariadb --no-defaults -S "$sock" -e 'SELECT 1'
    local pass; pass=$(cat "$db/slurm.pass")
    mariadb --no-defaults -S "$sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
      ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  fi
  pid_alive "$DIR/run/slurmdbd.pid" || slurmdbd
  wait_for slurmdbd "$DIR/log/slurmdbd.log" sacctmgr -n show cluster
  sacctmgr -n -P show cluster format=cluster | grep -qx gpuhub \
    || sacctmgr -i add cluster gpuhub >/dev/null
}

running_dbd() {  # yes/no: whether the running slurmctld keeps accounting ("" if it does not say)
  case $(scontrol show config 2>/dev/null | grep '^AccountingStorageType ') in
    *accounting_storage/slurmdbd) echo yes ;;
    *accounting_storage/none) echo no ;;
  esac
}

accounting_ok() {  # slurmctld runs with the accounting this start asks for, slurmdbd too
  [ "$DBD" != yes ] || pid_alive "$DIR/run/slurmdbd.pid" || return 1
  [ "$(running_dbd)" = "$DBD" ]
}

start_daemons() {
  if ! pid_alive "$DIR/run/slurmctld.pid"; then
    slurmctld -i   # -i: ignore saved state from an earlier run (jobs, node states)
  fi
  for i in $(seq 1 "$NODES"); do
    local n=$NODE_PREFIX$i
    mkdir -p "$DIR/spool/$n"
    # nsenter, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup
    pid_alive "$DIR/run/slurmd-$n.pid" || nsenter --net="/run/netns/$NS_PREFIX$n" slurmd -N "$n"
  done
}

all_idle() {  # every node up (idle, mixed or allocated), none down or drained
  local states
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(wc -l <<<"$states")" -eq "$NODES" ] || return 1
  ! grep -qvE ' (idle|mixed|allocated)$' <<<"$states"
}

start() {
  for c in slurmctld slurmd munged ip; do
    command -v "$c" >/dev/null || { say "$c is missing: apt-get install slurm-wlm munge iproute2"; exit 1; }
  done
  if [ "$DBD" = yes ]; then
    for c in slurmdbd mariadbd mariadb-install-db; do
      command -v "$c" >/dev/null || { say "$c is missing: apt-get install slurmdbd mariadb-server (or GPUHUB_SLURM_DBD=no)"; exit 1; }
    done
  fi
  if all_idle && accounting_ok; then
    say "already running ($SLURM_CONF)"
  else
    start_cluster
  fi
  login_start
}

start_cluster() {
  local running; running=$(running_dbd)
  if pid_alive "$DIR/run/slurmctld.pid" && [ -n "$running" ] && [ "$running" != "$DBD" ]; then
    # a cluster started by an older script (or with the other setting): keep it as it runs,
    # its nodes' configuration the same as slurmctld's
    say "slurmctld in $DIR runs with GPUHUB_SLURM_DBD=$running, kept (to change it: $0 stop," \
        "then start)"
    DBD=$running
  fi
  write_config
  start_munge
  setup_network  # first: slurmdbd listens on the bridge's address
  [ "$DBD" != yes ] || start_accounting
  start_daemons
  for _ in $(seq 1 120); do
    if all_idle; then say "up: $(sinfo -h -N -o '%N:%T' | tr '\n' ' ')($SLURM_CONF)"; return; fi
    sleep 0.5
  done
  say "nodes did not come up:"; sinfo -N -l >&2 || true
  for f in "$DIR"/log/*.log; do echo "== $f"; tail -n 20 "$f"; done >&2
  exit 1
}

end_jobs() {  # every job cancelled while slurmctld runs, then whatever is left on the nodes
  if pid_alive "$DIR/run/slurmctld.pid" && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 1 40); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25; done
  fi
}

kill_node_processes() {
  # slurmstepd, bubblewrap and servers: all run in a node's network namespace, and (with
  # proctrack/cgroup) in its jobs' cgroups, slurm_<node>/ (found there too once a namespace
  # is gone: a cluster stopped by an older script)
  local i pids
  for i in $(seq 1 "$NODES"); do
    pids=$(ip netns pids "$NS_PREFIX$NODE_PREFIX$i" 2>/dev/null || true)
    if [ -d "/sys/fs/cgroup/freezer/slurm_$NODE_PREFIX$i" ]; then
      pids+=" $(find "/sys/fs/cgroup/freezer/slurm_$NODE_PREFIX$i" -name cgroup.procs -exec cat {} + 2>/dev/null)"
    fi
    pids=$(tr -s ' \n' ' ' <<<"$pids")
    if [ -n "${pids// /}" ]; then kill -9 $pids 2>/dev/null || true; fi
  done
  for i in $(seq 1 "$NODES"); do
    for _ in $(seq 1 50); do
      [ -z "$(ip netns pids "$NS_PREFIX$NODE_PREFIX$i" 2>/dev/null)" ] && break; sleep 0.1
    done
  done
}

stop() {
  end_jobs
  login_stop
  ip link del "$VETH-hl" 2>/dev/null || true
  ip netns del "$LOGIN_NS" 2>/dev/null || true
  for pidf in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/slurmdbd.pid" \
              "$DIR/mysql/mariadb.pid" "$DIR/munge/munged.pid"; do
    [ -f "$pidf" ] || continue
    local pid; pid=$(cat "$pidf")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidf"
  done
  kill_node_processes
  for i in $(seq 1 "$NODES"); do
    ip link del "$VETH-h$i" 2>/dev/null || true
    ip netns del "$NS_PREFIX$NODE_PREFIX$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  say "stopped"
}

image() {  # unpack a Docker image's filesystem where every node reads it
  local name=$1 id dest tmp
  id=$(docker image inspect --format '{{.Id}}' "$name")
  dest=$DIR/images/$(tr '/:' '__' <<<"$name")
  if [ "$(cat "$dest/image-id" 2>/dev/null)" = "$id" ]; then
    [ -s "$dest/labels.json" ] || docker image inspect --format '{{json .Config.Labels}}' "$name" >"$dest/labels.json"
    mkdir -p "$dest/rootfs/datasets"
    say "$name is current in $dest"; return
  fi
  tmp=$dest.new
  rm -rf "$tmp"; mkdir -p "$tmp/rootfs"
  local cid; cid=$(docker create "$name")
  docker export "$cid" | tar -x -C "$tmp/rootfs"
  docker rm "$cid" >/dev/null
  # the datasets' mount point: bubblewrap cannot make one in the read-only root (Docker does)
  mkdir -p "$tmp/rootfs/datasets"
  echo "$id" >"$tmp/image-id"
  # the image's labels (Python, framework, CUDA), which the spawn page's cards show
  docker image inspect --format '{{json .Config.Labels}}' "$name" >"$tmp/labels.json"
  chmod 0755 "$tmp" "$tmp/rootfs"
  rm -rf "$dest"; mv "$tmp" "$dest"
  say "$name unpacked in $dest"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) all_idle && sinfo -N -o '%N %T %G %C' ;;
  env) echo "SLURM_CONF=$SLURM_CONF" ;;
  login-env) login_env ;;
  login-start) login_start ;;
  login-stop) login_stop; say "the submit host's sshd is stopped" ;;
  login-freeze) kill -STOP $(ip netns pids "$LOGIN_NS"); say "the submit host is frozen" ;;
  login-thaw) kill -CONT $(ip netns pids "$LOGIN_NS"); say "the submit host runs again" ;;
  image) shift; for name in "$@"; do image "$name"; done ;;
  *) echo "usage: $0 start|stop|status|env|login-env|login-start|login-stop|login-freeze|login-thaw|image NAME..." >&2; exit 2 ;;
esac
