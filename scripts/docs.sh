#!/usr/bin/env bash
# Build the documentation site (docs/) into docs/_build/html, with every warning an error:
# a broken internal link or reference, a page missing from the tree, a bad directive.
# What the build lacks (.venv with the docs extra: Sphinx, MyST, the theme) is installed
# first by scripts/setup.sh --for docs, as scripts/demo.sh and scripts/test.sh do theirs:
# after the demo, whose .venv has no Sphinx, or on a fresh clone.
# Usage: scripts/docs.sh [OUT_DIR [SOURCE_DIR]]   (tests/test_docs.py builds into a tmp dir)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-docs/_build/html}"
src="${2:-docs}"
# the docs extra's modules, and hub_ext (the reference pages read the code)
if ! .venv/bin/python -c "import sphinx, myst_parser, pydata_sphinx_theme, sphinx_copybutton, sphinxarg, yaml, hub_ext" 2>/dev/null; then
  bash scripts/setup.sh --for docs >&2
fi
exec .venv/bin/python -m sphinx -W --keep-going -n -q -b html "$src" "$out"
