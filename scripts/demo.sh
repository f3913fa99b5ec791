#!/usr/bin/env bash
# The demo: set up what is missing, then serve the hub at http://127.0.0.1:8000 on
# embedded defaults: SQLite under ./var, the machine's GPUs through NVML, or - where NVML
# finds no driver - a simulated two-GPU node, labelled as simulated on every page.
# People log in through the same OIDC authenticator as in production, against a local
# OpenID provider (oidc-provider-mock on 127.0.0.1:9400) where you pick who you are.
#
#   scripts/demo.sh                   # the Docker backend: servers are containers here
#   scripts/demo.sh --backend slurm   # the Slurm backend: starts the local two-node
#                                     # cluster (scripts/slurm-cluster.sh), servers are jobs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GPUHUB_BACKEND="${GPUHUB_BACKEND:-docker}"
while [ "$#" -gt 0 ]; do
  case $1 in
    --backend) GPUHUB_BACKEND=$2; shift 2 ;;
    --backend=*) GPUHUB_BACKEND=${1#*=}; shift ;;
    *) echo "usage: $0 [--backend docker|slurm]" >&2; exit 2 ;;
  esac
done
# the notebook images the demo serves; the hub itself runs from .venv, so the hub and
# postgres images (docker-compose.yml's) are not built here
if [ "$GPUHUB_BACKEND" = slurm ]; then
  bash scripts/setup.sh --for slurm base pytorch
else
  bash scripts/setup.sh --for demo base pytorch
fi
if [ "$GPUHUB_BACKEND" = slurm ]; then
  bash scripts/slurm-cluster.sh start
  bash scripts/slurm-cluster.sh image gpuhub/base:latest gpuhub/pytorch:latest
  slurm_dir="${GPUHUB_SLURM_DIR:-/srv/gpuhub-slurm}"
  # the demo's people are Unix accounts on the cluster: Slurm runs a job as its owner
  for name in admin alice bob carol; do id "$name" >/dev/null 2>&1 || useradd --no-create-home "$name"; done
  export GPUHUB_SLURM_CONF="${GPUHUB_SLURM_CONF:-$slurm_dir/slurm.conf}"
  export GPUHUB_SLURM_IMAGE_DIR="${GPUHUB_SLURM_IMAGE_DIR:-$slurm_dir/images}"
  export GPUHUB_SLURM_WORKSPACE="${GPUHUB_SLURM_WORKSPACE:-$slurm_dir/shared/home/{username\}}"
  export GPUHUB_SLURM_GPU_DEVICE="${GPUHUB_SLURM_GPU_DEVICE:-$slurm_dir/dev/\$SLURMD_NODENAME/nvidia\$i}"
  # the nodes reach the hub's API on the controller's bridge address
  export GPUHUB_HUB_IP="${GPUHUB_HUB_IP:-$(sed -n 's/^SlurmctldHost=.*(\(.*\))$/\1/p' "$GPUHUB_SLURM_CONF")}"
  export GPUHUB_GPUS="${GPUHUB_GPUS:-simulated:2}"  # the Docker pool is not used on Slurm
fi
if [ -z "${GPUHUB_GPUS:-}" ]; then
  # only a missing driver library means "no GPU here"; any other NVML failure on a GPU
  # server is a problem to fix, never papered over with simulated GPUs
  nvml="$(.venv/bin/python -c '
import pynvml
try:
    pynvml.nvmlInit()
    print("ok")
except pynvml.NVMLError_LibraryNotFound:
    print("absent")
except Exception as e:
    print(e)
' 2>&1 || true)"
  case "$nvml" in
    ok) export GPUHUB_GPUS=nvml ;;
    absent)
      echo "demo: no NVIDIA driver here (NVML library not found); using a SIMULATED node of 2 GPUs"
      export GPUHUB_GPUS=simulated:2 ;;
    *)
      echo "demo: NVML is installed but fails: $nvml" >&2
      echo "demo: fix the driver, or set GPUHUB_GPUS=simulated:2 to run on simulated GPUs" >&2
      exit 1 ;;
  esac
fi
export GPUHUB_DEMO_LOGIN="${GPUHUB_DEMO_LOGIN:-1}"
# the demo's own names, never production's (jupyter-<name>, volume jupyterhub-user-<name>):
# a production hub on this machine later neither adopts the demo's servers nor gives its
# members the demo's workspaces
export GPUHUB_HUB_ID="${GPUHUB_HUB_ID:-demo}"
export GPUHUB_CONTAINER_PREFIX="${GPUHUB_CONTAINER_PREFIX:-$GPUHUB_HUB_ID-jupyter}"
export GPUHUB_WORKSPACE="${GPUHUB_WORKSPACE:-$GPUHUB_HUB_ID-user-{username\}}"
if [ "$GPUHUB_BACKEND" = docker ] && [ -z "${GPUHUB_DOCKER_NETWORK:-}" ]; then
  # each member's server in a network namespace of its own, on a bridge network of the
  # demo's (GPUHUB_DEMO_NETWORK; GPUHUB_DEMO_SUBNET: three octets of a /24), firewalled as
  # production's: a server reaches the hub API on the bridge's gateway and nothing else of
  # this machine, and no other server (deploy/network/gpuhub-network.sh, which also removes
  # it: `... remove` with these variables; docs/explanation/security.md)
  subnet="${GPUHUB_DEMO_SUBNET:-10.217.0}"
  export GPUHUB_NETWORK="${GPUHUB_DEMO_NETWORK:-gpuhub-demo}" \
    GPUHUB_NETWORK_SUBNET="$subnet.0/24" GPUHUB_NETWORK_BRIDGE="ghd-$(echo "${subnet#*.}" | tr . -)" \
    GPUHUB_HUB_ADDRESS="$subnet.1" GPUHUB_NETWORK_HUB_PORTS="${GPUHUB_HUB_PORT:-8081}"
  bash deploy/network/gpuhub-network.sh create
  bash deploy/network/gpuhub-network.sh rules
  export GPUHUB_DOCKER_NETWORK="$GPUHUB_NETWORK" GPUHUB_HUB_IP="$subnet.1"
fi
state="${GPUHUB_STATE_DIR:-var}"
mkdir -p "$state"

# auth_state (the member's groups and credit balance) is encrypted with this key
if [ -z "${JUPYTERHUB_CRYPT_KEY:-}" ]; then
  if [ ! -s "$state/jupyterhub-crypt-key" ]; then
    (umask 077; .venv/bin/python -c "import secrets; print(secrets.token_hex(32))" \
      > "$state/jupyterhub-crypt-key")
  fi
  JUPYTERHUB_CRYPT_KEY="$(cat "$state/jupyterhub-crypt-key")"
  export JUPYTERHUB_CRYPT_KEY
fi

# the demo's OpenID provider: anyone can pick any identity, so loopback only
oidc_port="${GPUHUB_DEMO_OIDC_PORT:-9400}"
export GPUHUB_OIDC_ISSUER="${GPUHUB_OIDC_ISSUER:-http://127.0.0.1:$oidc_port}"
export GPUHUB_OIDC_CLIENT_ID="${GPUHUB_OIDC_CLIENT_ID:-gpuhub-demo}"
export GPUHUB_OIDC_CLIENT_SECRET="${GPUHUB_OIDC_CLIENT_SECRET:-demo-secret}"
export GPUHUB_ALLOWED_GROUPS="${GPUHUB_ALLOWED_GROUPS:-gpu-members}"
export GPUHUB_ADMIN_GROUPS="${GPUHUB_ADMIN_GROUPS:-hub-admins}"
export GPUHUB_ADMIN_CONTACT="${GPUHUB_ADMIN_CONTACT:-the demo admin (sign in as admin)}"
export GPUHUB_INITIAL_CREDITS="${GPUHUB_INITIAL_CREDITS:-10}"
# the demo's course ML101: bob its student (group ml101), carol its instructor
export GPUHUB_COURSES="${GPUHUB_COURSES:-$PWD/deploy/demo/courses.json}"
user() { printf '{"sub":"%s","preferred_username":"%s","email":"%s@example.org","groups":%s}' \
  "$1" "$1" "$1" "$2"; }
# a fresh secret per run: the provider asks for it before it hands out an identity, so code
# that shares its loopback (a member's container with GPUHUB_DOCKER_NETWORK=host) cannot
# sign in as admin (hub_ext/login/demo_provider.py)
(umask 077; .venv/bin/python -c "import secrets; print(secrets.token_urlsafe(12))" \
  > "$state/demo-login-secret")
demo_secret="$(cat "$state/demo-login-secret")"
.venv/bin/python -m hub_ext.login.demo_provider --host 127.0.0.1 --port "$oidc_port" \
  --secret-file "$state/demo-login-secret" \
  --user-claims "$(user admin '["hub-admins","gpu-members"]')" \
  --user-claims "$(user alice '["gpu-members"]')" \
  --user-claims "$(user bob '["gpu-members","ml101"]')" \
  --user-claims "$(user carol '["ml101-instructors"]')" \
  --user-claims "$(user mallory '[]')" \
  > "$state/oidc-provider.log" 2>&1 &
oidc_pid=$!
trap 'kill "$oidc_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$oidc_port/.well-known/openid-configuration" >/dev/null && break
  kill -0 "$oidc_pid" 2>/dev/null || { cat "$state/oidc-provider.log"; exit 1; }
  sleep 0.1
done

echo "demo: open http://127.0.0.1:${GPUHUB_PORT:-8000} and sign in at the demo provider as"
echo "      admin (an admin), alice or bob (members, $GPUHUB_INITIAL_CREDITS credits to start)"
echo "      carol (instructor of the course ML101, whose student is bob; its account"
echo "      course-ml101 gets 100 credits) or mallory (not a member: refused)"
echo "demo: the sign-in page asks for a password (any user name): $demo_secret"
echo "      (a new one each run; also in $state/demo-login-secret)"
# ML101's account: 100 credits once the hub's own credits service answers (the same
# Idempotency-Key every run, so granted once)
if [ "${GPUHUB_CREDITS:-on}" = on ] && [ -z "${GPUHUB_CREDITS_URL:-}" ]; then
  (for _ in $(seq 120); do
    .venv/bin/gpuhub credits grant course-ml101 100 --key demo-course-ml101 \
      --reason "the demo course's budget" >/dev/null 2>&1 && exit 0
    sleep 1
  done) &
fi
if [ -n "${GPUHUB_HUB_IP:-}" ]; then
  echo "demo: the hub API listens on $GPUHUB_HUB_IP; gpuhub commands in another shell need"
  echo "      GPUHUB_HUB_IP=$GPUHUB_HUB_IP (e.g. GPUHUB_HUB_IP=$GPUHUB_HUB_IP .venv/bin/gpuhub gpus)"
fi
.venv/bin/jupyterhub -f jupyterhub_config.py
