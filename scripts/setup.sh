#!/usr/bin/env bash
# Install and start everything the hub and its tests need, on a fresh Debian bookworm
# machine or an existing one (each step is skipped when already done):
#   system packages (Slurm, munge and bubblewrap for the slurm tier, slurmdbd and MariaDB for its
#   accounting: its cluster is started by the tests, scripts/slurm-cluster.sh), the Docker engine (scripts/start-dockerd.sh), the Python virtual
#   environment .venv with this project and its test and docs tools, configurable-http-proxy
#   (npm), and the images.
# Usage: scripts/setup.sh [IMAGE ...]   (images default to: base pytorch hub postgres, the
#   notebook images and what docker-compose.yml runs; see scripts/build-images.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

# Debian packages, each only when what it provides is missing. Node and npm are judged by
# their commands: a machine with NodeSource's nodejs (which bundles npm) cannot also take
# Debian's npm package ("held broken packages").
packages=(docker.io docker-compose mmdebstrap gcc postgresql chromium openssl
          slurm-wlm munge iproute2 bubblewrap openssh-server openssh-client slurmdbd
          mariadb-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  step "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

step "docker engine"
bash scripts/start-dockerd.sh

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import hub_ext, pytest, jupyterhub, sphinx, myst_parser" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  step "python: .venv with gpu-cluster-hub[test,docs]"
  python3 -m venv .venv
  .venv/bin/pip install -q -e ".[test,docs]"
  touch .venv/.installed
fi

if [ ! -x node_modules/.bin/configurable-http-proxy ]; then
  step "npm: configurable-http-proxy"
  npm ci --no-audit --no-fund --silent
fi

step "images"
[ "$#" -gt 0 ] || set -- base pytorch hub postgres
bash scripts/build-images.sh "$@"
