#!/usr/bin/env bash
# The test command: set up what is missing (scripts/setup.sh), then run every test tier
# that this machine can run. Extra arguments go to pytest, e.g. scripts/test.sh -k pool
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
mkdir -p artifacts
exec .venv/bin/pytest --junitxml=artifacts/junit.xml "$@"
