#!/usr/bin/env bash
# Build the documentation site (docs/) into docs/_build/html, with every warning an error:
# a broken internal link or reference, a page missing from the tree, a bad directive.
# Usage: scripts/docs.sh [OUT_DIR [SOURCE_DIR]]   (tests/test_docs.py builds into a tmp dir)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-docs/_build/html}"
src="${2:-docs}"
exec .venv/bin/sphinx-build -W --keep-going -n -q -b html "$src" "$out"
