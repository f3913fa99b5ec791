#!/usr/bin/env bash
# Make sure a Docker engine answers on /var/run/docker.sock.
#
# A running engine is left alone. Otherwise Docker is installed from Debian if
# missing and dockerd is started the way these machines need it (see
# ../shared/MACHINE.md): no bridge, no iptables, every container on host
# networking. With GPUHUB_GPU_STANDIN=1 (the default when no NVIDIA driver is
# present) the NVIDIA hook stand-in is put on dockerd's PATH so that GPU
# DeviceRequests run their real path without a GPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if docker info >/dev/null 2>&1; then
  echo "docker: engine already running"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "docker: installing docker.io from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q docker.io >/dev/null
fi

standin="${GPUHUB_GPU_STANDIN:-}"
if [ -z "$standin" ]; then
  if command -v nvidia-container-runtime-hook >/dev/null 2>&1; then standin=0; else standin=1; fi
fi
path="$PATH"
if [ "$standin" = 1 ]; then
  mkdir -p /usr/local/lib/gpuhub-standins
  install -m 0755 "$here/tests/standins/nvidia-container-runtime-hook" /usr/local/lib/gpuhub-standins/
  path="/usr/local/lib/gpuhub-standins:$PATH"
  echo "docker: NVIDIA hook stand-in on dockerd's PATH (no GPU on this machine)"
fi

log=/var/log/gpuhub-dockerd.log
echo "docker: starting dockerd (log: $log)"
PATH="$path" setsid nohup dockerd --bridge=none --iptables=false >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker: engine ready"
    exit 0
  fi
  sleep 0.5
done
echo "docker: dockerd did not answer within 30 s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
