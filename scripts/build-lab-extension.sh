#!/usr/bin/env bash
# Build the JupyterLab extension of gpuhub/base (images/lab-extension, TypeScript) into its
# prebuilt (federated) form, images/base/gpuhub_lab/labextension/, which is committed: the
# image build copies it and needs neither Node nor the npm registry (images/README.md,
# "JupyterLab"). Run it after changing anything in images/lab-extension/ and commit the
# result; tests/test_lab_extension.py fails while the committed build is older than its
# sources (it compares the sources' fingerprint written here).
#
# Usage: scripts/build-lab-extension.sh
#
# Needs Node 20 and npm with the npm registry (npm ci, from package-lock.json), and pip with
# PyPI once: JupyterLab's own core package list (jupyterlab/staging/package.json, which
# says which packages the page shares) is read from the jupyterlab wheel that
# images/base/requirements.txt pins, downloaded into GPUHUB_CACHE (default ./wheelhouse).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$repo/images/lab-extension"
out="$repo/images/base/gpuhub_lab/labextension"
cache="${GPUHUB_CACHE:-$repo/wheelhouse}/lab-core"
die() { printf 'build-lab-extension: %s\n' "$*" >&2; exit 1; }

command -v npm >/dev/null || die "npm is needed (Node 20: apt-get install nodejs npm)"
version="$(sed -n 's/^jupyterlab==\([^ ]*\).*/\1/p' "$repo/images/base/requirements.txt")"
[ -n "$version" ] || die "no jupyterlab==<version> in images/base/requirements.txt"

core="$cache/jupyterlab-$version"
if [ ! -f "$core/jupyterlab/staging/package.json" ]; then
  mkdir -p "$cache"
  pip=("$repo/.venv/bin/pip")
  [ -x "${pip[0]}" ] || pip=(python3 -m pip)
  "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$cache" "jupyterlab==$version" || die "pip could not download jupyterlab==$version"
  rm -rf "$core.partial"
  mkdir -p "$core.partial"
  python3 -m zipfile -e "$cache/jupyterlab-$version-py3-none-any.whl" "$core.partial" >/dev/null
  find "$core.partial" -mindepth 1 -maxdepth 1 ! -name jupyterlab -exec rm -rf {} +
  mv "$core.partial" "$core"
fi

cd "$src"
npm ci --no-audit --no-fund --loglevel=error
rm -rf lib tsconfig.tsbuildinfo
npx tsc
npx build-labextension --core-path "$core/jupyterlab/staging" .
python3 "$src/fingerprint.py" "$src" >"$out/sources.sha256"
echo "build-lab-extension: built $out for JupyterLab $version ($(du -sh "$out" | cut -f1))"
