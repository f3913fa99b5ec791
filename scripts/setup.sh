#!/usr/bin/env bash
# Install and start everything the hub and its tests need, on a fresh Debian bookworm
# machine or an existing one (each step is skipped when already done):
#   system packages, the Docker engine (scripts/start-dockerd.sh), the Python virtual
#   environment .venv with this project, configurable-http-proxy (npm), and the images.
# Usage: scripts/setup.sh [--for demo|slurm|tests|docs] [--list-packages] [IMAGE ...]
#   --for demo    what the Docker demo needs (scripts/demo.sh): Docker, iptables (the members'
#                 network, deploy/network/gpuhub-network.sh), mmdebstrap, Node, the hub and
#                 the demo's OIDC provider; no Slurm, no databases, no browser
#   --for slurm   the demo on the Slurm backend (scripts/demo.sh --backend slurm): the above
#                 plus Slurm, munge, bubblewrap, slirp4netns and passt (the jobs' outbound
#                 traffic, GPUHUB_SLURM_OUTBOUND), slurmdbd and MariaDB (its accounting)
#   --for tests   (the default) everything the test tiers use: the above plus PostgreSQL,
#                 Chromium, docker-compose, openssh (the Slurm submit host), the test extras
#                 and the docs' (Sphinx, which the tests run)
#   --for docs    what scripts/docs.sh needs: .venv with the docs extra (Sphinx, MyST) and
#                 nothing else: no Debian packages, no Docker, no Node, no images
#   --list-packages  print the Debian packages that purpose needs, one a line, and stop
#   IMAGE         images default to: base pytorch hub postgres, the notebook images and what
#                 docker-compose.yml runs (see scripts/build-images.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

purpose=tests
list_only=
while [ "$#" -gt 0 ]; do
  case $1 in
    --for) purpose=${2-}; shift $(( $# > 1 ? 2 : 1 )) ;;
    --for=*) purpose=${1#*=}; shift ;;
    --list-packages) list_only=1; shift ;;
    *) break ;;
  esac
done
demo_packages=(docker.io iptables mmdebstrap gcc openssl curl)
slurm_packages=(slurm-wlm munge iproute2 bubblewrap slirp4netns passt slurmdbd mariadb-server)
test_packages=(docker-compose postgresql chromium openssh-server openssh-client)
case "$purpose" in
  demo) packages=("${demo_packages[@]}"); extras=demo ;;
  slurm) packages=("${demo_packages[@]}" "${slurm_packages[@]}"); extras=demo ;;
  tests) packages=("${demo_packages[@]}" "${slurm_packages[@]}" "${test_packages[@]}")
         extras=test,docs ;;
  docs) packages=(); extras=docs ;;
  *) echo "setup.sh: --for takes demo, slurm, tests or docs, not '$purpose'" >&2; exit 2 ;;
esac
if [ -n "$list_only" ]; then
  [ "${#packages[@]}" -eq 0 ] || printf '%s\n' "${packages[@]}"
  exit 0
fi

# Debian packages, each only when what it provides is missing. Node and npm are judged by
# their commands: a machine with NodeSource's nodejs (which bundles npm) cannot also take
# Debian's npm package ("held broken packages").
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "$purpose" != docs ]; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  step "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$purpose" != docs ]; then
  step "docker engine"
  bash scripts/start-dockerd.sh
fi

# .venv/.installed-<extras> marks what was installed, and when: a newer pyproject.toml
# installs again
mark=".venv/.installed-${extras//,/-}"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import hub_ext, jupyterhub" 2>/dev/null \
   || [ ! -e "$mark" ] || [ pyproject.toml -nt "$mark" ]; then
  step "python: .venv with gpu-cluster-hub[$extras]"
  python3 -m venv .venv
  .venv/bin/pip install -q -e ".[$extras]"
  touch "$mark"
  # the test extras hold the demo's
  [ "$extras" = demo ] || touch .venv/.installed-demo
fi

[ "$purpose" != docs ] || exit 0  # the docs need nothing below

if [ ! -x node_modules/.bin/configurable-http-proxy ]; then
  step "npm: configurable-http-proxy"
  npm ci --no-audit --no-fund --silent
fi

step "images"
[ "$#" -gt 0 ] || set -- base pytorch hub postgres
bash scripts/build-images.sh "$@"
