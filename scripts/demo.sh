#!/usr/bin/env bash
# The demo: set up what is missing, then serve the hub at http://127.0.0.1:8000 on
# embedded defaults: SQLite under ./var, the machine's GPUs through NVML, or - where NVML
# finds no driver - a simulated two-GPU node, labelled as simulated on every page.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
if [ -z "${GPUHUB_GPUS:-}" ]; then
  if .venv/bin/python -c "import pynvml; pynvml.nvmlInit()" 2>/dev/null; then
    export GPUHUB_GPUS=nvml
  else
    echo "demo: NVML finds no GPU driver here; using a SIMULATED node of 2 GPUs"
    export GPUHUB_GPUS=simulated:2
  fi
fi
export GPUHUB_DEMO_LOGIN="${GPUHUB_DEMO_LOGIN:-1}"
export GPUHUB_DOCKER_NETWORK="${GPUHUB_DOCKER_NETWORK:-host}"
echo "demo: open http://127.0.0.1:${GPUHUB_PORT:-8000} (any username; 'admin' is an admin)"
exec .venv/bin/jupyterhub -f jupyterhub_config.py
