#!/usr/bin/env bash
# Build the single-user images in dependency order: gpuhub/base, then gpuhub/pytorch and
# gpuhub/tensorflow FROM it; and the images docker-compose.yml runs: gpuhub/hub, and
# PostgreSQL. One command on a fresh Debian machine with only a Docker engine (no registry: the
# Debian bases are made here with mmdebstrap) and, unchanged, on a real server with an NVIDIA
# CUDA base image.
#
# Usage: scripts/build-images.sh [--offline|--online] [--base IMAGE] [--local-base]
#                                [--variant cpu|cuda] [--force] [IMAGE ...]
#   IMAGE         base, pytorch, tensorflow, hub, postgres, or all (default: base pytorch).
#                 base is handled first when a notebook image is named, since the others are
#                 built FROM gpuhub/base:latest.
#                 hub: gpuhub/hub:latest (JupyterHub, hub_ext, configurable-http-proxy) FROM
#                 debian:bookworm-slim (online) or a local Debian base (offline).
#                 postgres: the image docker-compose.yml names for PostgreSQL
#                 (postgres:15-bookworm): pulled online; offline, a stand-in built from
#                 Debian's postgresql (tests/standins/postgres) under that name, unless a real
#                 image already has it.
#   --offline     wheels are downloaded on this host (pip download, cached in ./wheelhouse/) and
#                 the builds run with --network none. The default when Docker Hub does not answer.
#   --online      pip inside the builds installs from PyPI (torch from PyPI's and PyTorch's index).
#   --base IMAGE  what gpuhub/base is built FROM (not hub). Default online: the NVIDIA CUDA image below;
#                 default offline: the local Debian base, made with mmdebstrap when missing.
#   --local-base  use the local Debian base (made when missing) in online mode too.
#   --variant V   framework builds for cpu or cuda, tagged NAME:V (and NAME:latest when V is
#                 the base's own). Default: cuda when gpuhub/base has a CUDA
#                 runtime (io.gpuhub.cuda.version), else cpu.
#   --force       rebuild the IMAGEs named even when their inputs have not changed (otherwise
#                 an image whose sources, parent and arguments are unchanged is kept).
#
# Environment: JUPYTERHUB_VERSION (default: the hub's own, from .venv), TORCH_VERSION,
# TORCH_INDEX_URL, TORCH_CUDA_VERSION, TENSORFLOW_PACKAGE, TENSORFLOW_VERSION,
# TENSORFLOW_CUDA_VERSION (defaults per variant below), GPUHUB_IMAGE_NAMESPACE (default:
# gpuhub, as in gpuhub/base:latest; e.g. registry.example.org/gpuhub), GPUHUB_IMAGE_SOURCE (the
# org.opencontainers.image.source label; default: the git remote), GPUHUB_CACHE (default:
# ./wheelhouse; wheelhouses, build contexts and logs). In offline mode the host's own pip
# configuration decides where wheels come from (here: PyPI plus /opt/wheels for CPU torch).
#
# Every label is checked inside the build (gpuhub-image-facts) against what was installed.
set -euo pipefail
shopt -s inherit_errexit
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DOCKER_BUILDKIT=0

CUDA_BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
LOCAL_BASE=gpuhub/debian-base:bookworm
LOCAL_SUITE=bookworm
HUB_BASE=debian:bookworm-slim
HUB_LOCAL_BASE=gpuhub/debian-base:bookworm-hub
# Must be the image docker-compose.yml names for PostgreSQL.
POSTGRES_IMAGE=postgres:15-bookworm
POSTGRES_LOCAL_BASE=gpuhub/debian-base:bookworm-postgres
ns="${GPUHUB_IMAGE_NAMESPACE:-gpuhub}"

# Framework pins per variant. A value that disagrees with what pip installs stops the build
# (the labels are checked), so a wrong default cannot reach a label.
variant_defaults() {
  case "$1" in
    cpu)
      : "${TORCH_VERSION:=2.13.0+cpu}" "${TORCH_INDEX_URL:=https://download.pytorch.org/whl/cpu}"
      : "${TORCH_CUDA_VERSION:=none}"
      : "${TENSORFLOW_PACKAGE:=tensorflow-cpu}" "${TENSORFLOW_VERSION:=2.21.0}"
      : "${TENSORFLOW_CUDA_VERSION:=none}"
      ;;
    cuda)
      : "${TORCH_VERSION:=2.6.0+cu124}" "${TORCH_INDEX_URL:=https://download.pytorch.org/whl/cu124}"
      : "${TORCH_CUDA_VERSION:=12.4}"
      : "${TENSORFLOW_PACKAGE:=tensorflow[and-cuda]}" "${TENSORFLOW_VERSION:=2.21.0}"
      : "${TENSORFLOW_CUDA_VERSION:=12.5}"
      ;;
    *) die "no such variant: '$1'. Options include: cpu, cuda" ;;
  esac
}

started=$SECONDS
say() { printf '==> [%4ss] %s\n' "$((SECONDS - started))" "$*"; }
die() { printf 'build-images: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

mode="" base="" local_base=0 variant="" force=0 images=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --offline) mode=offline ;;
    --online) mode=online ;;
    --base) [ "$#" -ge 2 ] || die "--base needs an image"; base=$2; shift ;;
    --base=*) base=${1#--base=} ;;
    --local-base) local_base=1 ;;
    --variant) [ "$#" -ge 2 ] || die "--variant needs cpu or cuda"; variant=$2; shift ;;
    --variant=*) variant=${1#--variant=} ;;
    --force) force=1 ;;
    -h | --help) usage; exit 0 ;;
    all) images+=(base pytorch tensorflow hub postgres) ;;
    base | pytorch | tensorflow | hub | postgres) images+=("$1") ;;
    *) die "no such image or option: '$1'. Options include: base, pytorch, tensorflow, hub, postgres, all, --offline, --online, --base IMAGE, --local-base, --variant cpu|cuda, --force (see --help)" ;;
  esac
  shift
done
[ "${#images[@]}" -gt 0 ] || images=(base pytorch)
[ -z "$base" ] || [ "$local_base" = 0 ] || die "--base and --local-base exclude each other"
want() { local i; for i in "${images[@]}"; do [ "$i" = "$1" ] && return 0; done; return 1; }
forced() { [ "$force" = 1 ] && want "$1"; }
# current NAME IMAGE FINGERPRINT: IMAGE was built from exactly these inputs (its fingerprint
# label) and --force does not ask for NAME again
current() { ! forced "$1" && [ "$(label "$2" io.gpuhub.build.fingerprint)" = "$3" ]; }
[ -z "$variant" ] || variant_defaults "$variant"

cache="${GPUHUB_CACHE:-$repo/wheelhouse}"
mkdir -p "$cache/logs" "$cache/.context"
work="$(mktemp -d "$cache/.context/run.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# --- what every build needs ---------------------------------------------------------------------

docker info >/dev/null 2>&1 || bash "$repo/scripts/start-dockerd.sh"

registry_answers() {
  python3 - <<'EOF' >/dev/null 2>&1
import urllib.error, urllib.request
try:
    urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=5)
except urllib.error.HTTPError:
    pass  # 401 asks for a token: the registry is there
EOF
}
if [ -z "$mode" ]; then
  if registry_answers; then mode=online; else mode=offline; fi
  say "mode: $mode (Docker Hub $( [ "$mode" = online ] && echo answers || echo "does not answer"))"
else
  say "mode: $mode"
fi
if [ "$mode" = offline ]; then network=none; else network=host; fi

host_pip() {
  if [ -x "$repo/.venv/bin/pip" ]; then "$repo/.venv/bin/pip" "$@"
  elif python3 -m pip --version >/dev/null 2>&1; then python3 -m pip "$@"
  else die "pip is needed on this host for offline builds (apt-get install python3-pip, or scripts/setup.sh)"
  fi
}

hub_version() {
  if [ -n "${JUPYTERHUB_VERSION:-}" ]; then echo "$JUPYTERHUB_VERSION"; return; fi
  local py
  for py in "$repo/.venv/bin/python" python3; do
    if "$py" -c 'import jupyterhub' >/dev/null 2>&1; then
      "$py" -c 'import jupyterhub; print(jupyterhub.__version__)'
      return
    fi
  done
  die "cannot tell the hub's jupyterhub version (no .venv with jupyterhub): set JUPYTERHUB_VERSION"
}

label() { docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

# Labels of the OCI convention, the same for every image of one run.
image_version="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml" 2>/dev/null || echo unknown)"
image_revision="$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
[ -z "$(git -C "$repo" status --porcelain 2>/dev/null | head -n 1)" ] || image_revision+="-dirty"
image_source="${GPUHUB_IMAGE_SOURCE:-$(git -C "$repo" remote get-url origin 2>/dev/null | sed -E 's#//[^/@]*@#//#' || true)}"
image_source="${image_source:-file://$repo}"
oci_args=(
  --build-arg "IMAGE_VERSION=$image_version" --build-arg "IMAGE_REVISION=$image_revision"
  --build-arg "IMAGE_CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --build-arg "IMAGE_SOURCE=$image_source"
)

# --- the local Debian base --------------------------------------------------------------------

# ensure_local_base [TAG PACKAGE_LIST]: made with mmdebstrap from this machine's own apt
# sources, with every package of the list (default: gpuhub/debian-base:bookworm with
# images/base/os-packages.txt): an offline build cannot run apt-get.
ensure_local_base() {
  local tag=${1:-$LOCAL_BASE} list=${2:-$repo/images/base/os-packages.txt} pkgs have tmp log
  pkgs="$(grep -v '^#' "$list" | LC_ALL=C sort | paste -sd, -)"
  log="$cache/logs/local-base-${tag##*:}.log"
  have="$(label "$tag" io.gpuhub.base.packages)"
  if [ "$have" = "$pkgs" ]; then
    say "local base $tag: present ($pkgs)"
    return
  fi
  if [ -n "$(image_id "$tag")" ]; then
    say "local base $tag: present but made without some of $pkgs; making it again"
  else
    say "local base $tag: missing; making it with mmdebstrap ($pkgs)"
  fi
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    say "installing mmdebstrap from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null
  fi
  tmp="$(mktemp -d "$work/rootfs.XXXXXX")"
  mmdebstrap --quiet --variant=apt --include="$pkgs" "$LOCAL_SUITE" "$tmp/rootfs.tar" \
    >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; die "mmdebstrap failed (log: $log)"; }
  docker import --change "LABEL io.gpuhub.base.packages=$pkgs" \
    --message "mmdebstrap --variant=apt $LOCAL_SUITE" "$tmp/rootfs.tar" "$tag" >/dev/null
  rm -rf "$tmp"
  say "local base $tag: made ($(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=si --format=%.1f))"
}

# --- wheelhouses ------------------------------------------------------------------------------

# wheelhouse NAME PYTHON GLIBC ARCH [PIP_DOWNLOAD_ARGS...]: print the folder holding every wheel
# needed to pip-install PIP_DOWNLOAD_ARGS on that interpreter. Kept in $cache/NAME and reused
# while the inputs are the same (then no network is needed at all).
wheelhouse() {
  local name=$1 py=$2 glibc=$3 arch=$4
  shift 4
  local dir="$cache/$name" key abi major minor n platforms=()
  major=${py%%.*} minor=${py#*.}; minor=${minor%%.*}
  abi="cp$major$minor"
  [ "$glibc" != none ] || die "$name: the base image has no glibc; only manylinux wheels are handled"
  # pip does not widen an explicit --platform, so list every manylinux tag this glibc runs.
  for ((n = ${glibc#*.}; n >= 5; n--)); do platforms+=(--platform "manylinux_2_${n}_$arch"); done
  platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
  local args=(--only-binary=:all: --implementation cp --python-version "$py" --abi "$abi" "${platforms[@]}" "$@")
  # The key names files by their content, not their path.
  key="$(for a in "${args[@]}"; do if [ -f "$a" ]; then sha256sum <"$a"; else echo "$a"; fi; done \
    | sha256sum | cut -c1-16)"
  if [ -f "$dir/.key" ] && [ "$(cat "$dir/.key")" = "$key" ]; then
    say "$name: wheelhouse cached ($(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1))" >&2
  else
    say "$name: downloading wheels for Python $py ($abi, glibc $glibc) into $dir" >&2
    rm -rf "$dir" "$dir.partial"
    host_pip download --quiet --disable-pip-version-check --dest "$dir.partial" "${args[@]}" \
      2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2 \
      || die "$name: pip download failed"
    echo "$key" >"$dir.partial/.key"
    mv "$dir.partial" "$dir"
    say "$name: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1)" >&2
  fi
  echo "$dir"
}

# --- building ---------------------------------------------------------------------------------

# context NAME [WHEELHOUSE]: a build context with images/NAME and, offline, the wheels.
context() {
  local ctx="$work/$1"
  rm -rf "$ctx"
  cp -a "$repo/images/$1" "$ctx"
  find "$ctx/wheelhouse" -name '*.whl' -delete
  if [ -n "${2:-}" ]; then
    cp -l "$2"/*.whl "$ctx/wheelhouse/" 2>/dev/null || cp "$2"/*.whl "$ctx/wheelhouse/"
  fi
  echo "$ctx"
}

# fingerprint NAME ARGS...: changes when the image's sources, its parent or its arguments do.
fingerprint() {
  local name=$1
  shift
  {
    (cd "$repo/images/$name" && find . -type f ! -name '*.whl' | LC_ALL=C sort | xargs sha256sum)
    printf '%s\n' "$mode" "$@"
  } | sha256sum | cut -c1-16
}

# replace_leftover OLD_ID TAG: after TAG moved to a new image, remove the one it replaced unless
# something still uses it (a container, a child image); stale images would pile up otherwise.
replace_leftover() {
  if [ -n "$1" ] && [ "$1" != "$(image_id "$2")" ]; then docker rmi "$1" >/dev/null 2>&1 || true; fi
}

# docker_build LOGNAME ARGS...: the legacy builder, showing its main steps and checks; the full
# log is kept.
docker_build() {
  local log="$cache/logs/$1.log"
  shift
  if ! docker build --force-rm --network "$network" "$@" 2>&1 | tee "$log" \
      | { grep --line-buffered -E '^(Step [0-9]+/[0-9]+ : (FROM|COPY|RUN) |gpuhub-pip: |ok: )' || true; } \
      | cut -c1-110 | sed -u 's/^/      /'; then
    echo "---- last lines of $log" >&2
    tail -n 40 "$log" >&2
    die "docker build failed ($log)"
  fi
}

declare -A outcome seconds_taken

# probe IMAGE: "PYTHON GLIBC ARCH CUDA_MAJOR_MINOR" of the image's python3.
probe() {
  docker run --rm --network none --entrypoint python3 "$1" -c '
import os, platform
cuda = os.environ.get("CUDA_VERSION") or ""
print(platform.python_version(), platform.libc_ver()[1] or "none", platform.machine(),
      ".".join(cuda.split(".")[:2]) or "none")'
}

build_base() {
  local t0=$SECONDS from hub fp ctx wh="" pyver glibc arch cuda replaced
  if [ -n "$base" ]; then
    from=$base
  elif [ "$mode" = offline ] || [ "$local_base" = 1 ]; then
    ensure_local_base
    from=$LOCAL_BASE
  else
    from=$CUDA_BASE
  fi
  if [ -z "$(image_id "$from")" ]; then
    [ "$mode" = online ] || die "base image $from is not here and offline mode cannot pull it; use --local-base or docker load it"
    say "base: pulling $from"
    docker pull -q "$from" >/dev/null
  fi
  hub="$(hub_version)"
  fp="$(fingerprint base "$from" "$(image_id "$from")" "$hub")"
  if current base "$ns/base:latest" "$fp"; then
    say "base: $ns/base:latest is up to date (FROM $from, jupyterhub $hub)"
    outcome[base]="up to date"
    return
  fi
  say "base: building $ns/base:latest FROM $from (jupyterhub $hub)"
  replaced="$(image_id "$ns/base:latest")"
  ctx="$(context base)"
  # The system stage first: what it runs decides the Python that the wheels are for.
  docker_build base-os --target os --iidfile "$work/os.iid" --build-arg "BASE_IMAGE=$from" "$ctx"
  read -r pyver glibc arch cuda < <(probe "$(cat "$work/os.iid")") \
    || die "base: python3 does not run in the system stage of $from"
  say "base: Python $pyver, glibc $glibc, $arch, CUDA $cuda"
  if [ "$mode" = offline ]; then
    wh="$(wheelhouse "base-py$pyver" "$pyver" "$glibc" "$arch" \
      -r "$repo/images/base/requirements.txt" "jupyterhub==$hub")"
    ctx="$(context base "$wh")"
  fi
  docker_build base -t "$ns/base:latest" "${oci_args[@]}" \
    --build-arg "BASE_IMAGE=$from" --build-arg "PYTHON_VERSION=$pyver" \
    --build-arg "BASE_CUDA_VERSION=$cuda" --build-arg "JUPYTERHUB_VERSION=$hub" \
    --build-arg "BUILD_FINGERPRINT=$fp" "$ctx"
  replace_leftover "$replaced" "$ns/base:latest"
  outcome[base]="built"
  seconds_taken[base]=$((SECONDS - t0))
  say "base: built $ns/base:latest in ${seconds_taken[base]}s"
}

# build_framework NAME REQUIREMENT BUILD_ARGS...: NAMESPACE/NAME:VARIANT FROM
# NAMESPACE/base:latest, also tagged :latest when VARIANT is the base's own (cuda on a CUDA
# base, cpu on a CPU one): a CPU-only build (--variant cpu) on a GPU server stands beside the
# CUDA one as NAME:cpu, for a CPU profile, instead of replacing it.
build_framework() {
  local name=$1 requirement=$2
  shift 2
  local t0=$SECONDS parent pyver glibc arch cuda fp ctx wh="" replaced tags
  local image="$ns/$name:$variant"
  tags=(-t "$image")
  [ "$variant" != "$base_variant" ] || tags+=(-t "$ns/$name:latest")
  parent="$(image_id "$ns/base:latest")"
  [ -n "$parent" ] || die "$name: $ns/base:latest is missing"
  fp="$(fingerprint "$name" "$parent" "$@")"
  if current "$name" "$image" "$fp"; then
    [ "$variant" != "$base_variant" ] || docker tag "$image" "$ns/$name:latest"
    say "$name: $image is up to date ($requirement)"
    outcome[$name]="up to date"
    return
  fi
  say "$name: building $image ($requirement, variant $variant)"
  replaced="$(image_id "$image")"
  ctx="$(context "$name")"
  if [ "$mode" = offline ]; then
    read -r pyver glibc arch cuda < <(probe "$ns/base:latest")
    # Download against the base's exact packages: the build holds them at these versions.
    docker run --rm --network none --entrypoint /opt/venv/bin/pip "$ns/base:latest" \
      freeze --all --disable-pip-version-check | grep -v ' @ ' >"$work/$name-held.txt"
    wh="$(wheelhouse "$name-py$pyver" "$pyver" "$glibc" "$arch" \
      --constraint "$work/$name-held.txt" "$requirement")"
    ctx="$(context "$name" "$wh")"
  fi
  docker_build "$name" "${tags[@]}" "${oci_args[@]}" \
    --build-arg "BASE_IMAGE=$ns/base:latest" --build-arg "BUILD_FINGERPRINT=$fp" \
    "${@/#/--build-arg=}" "$ctx"
  replace_leftover "$replaced" "$image"
  outcome[$name]="built"
  seconds_taken[$name]=$((SECONDS - t0))
  say "$name: built $image${tags[3]:+ (and :latest)} in ${seconds_taken[$name]}s"
}

# --- the images docker-compose.yml runs -------------------------------------------------------

# The repository paths gpuhub/hub is built from (images/hub/Dockerfile copies these).
HUB_SOURCES=(pyproject.toml README.md jupyterhub_config.py package.json package-lock.json
  hub_ext share images/hub images/base/gpuhub-pip)

# fingerprint_paths PATHS... -- ARGS...: like fingerprint, for files anywhere in the repository.
fingerprint_paths() {
  local paths=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do paths+=("$1"); shift; done
  shift
  {
    (cd "$repo" && find "${paths[@]}" -type f ! -name '*.whl' ! -name '*.pyc' \
      ! -path '*/__pycache__/*' ! -path '*/node_modules/*' | LC_ALL=C sort | xargs sha256sum)
    printf '%s\n' "$mode" "$@"
  } | sha256sum | cut -c1-16
}

# hub_requirements FILE: the project's dependencies with the postgres extra, and what pip
# needs to build the project itself (pyproject.toml's build-system), one per line.
hub_requirements() {
  python3 - "$repo/pyproject.toml" >"$1" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))
lines = project["project"]["dependencies"] + project["project"]["optional-dependencies"]["postgres"]
lines += project["build-system"]["requires"]
print("\n".join(lines))
PY
}

build_hub() {
  local t0=$SECONDS from fp ctx wh pyver glibc arch cuda replaced
  if [ "$mode" = offline ] || [ "$local_base" = 1 ]; then
    ensure_local_base "$HUB_LOCAL_BASE" "$repo/images/hub/os-packages.txt"
    from=$HUB_LOCAL_BASE
  else
    from=$HUB_BASE
    [ -n "$(image_id "$from")" ] || { say "hub: pulling $from"; docker pull -q "$from" >/dev/null; }
  fi
  [ -n "$(image_id "$from")" ] || die "hub: base image $from is missing"
  fp="$(fingerprint_paths "${HUB_SOURCES[@]}" -- "$from" "$(image_id "$from")")"
  if current hub "$ns/hub:latest" "$fp"; then
    say "hub: $ns/hub:latest is up to date (FROM $from)"
    outcome[hub]="up to date"
    return
  fi
  say "hub: building $ns/hub:latest FROM $from"
  replaced="$(image_id "$ns/hub:latest")"
  ctx="$work/hub"
  rm -rf "$ctx"
  mkdir -p "$ctx"
  tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.whl' \
    --exclude=node_modules -cf - "${HUB_SOURCES[@]}" | tar -C "$ctx" -xf -
  if [ "$mode" = offline ]; then
    read -r pyver glibc arch cuda < <(probe "$from") || die "hub: python3 does not run in $from"
    hub_requirements "$work/hub-requirements.txt"
    wh="$(wheelhouse "hub-py$pyver" "$pyver" "$glibc" "$arch" -r "$work/hub-requirements.txt")"
    cp -l "$wh"/*.whl "$ctx/images/hub/wheelhouse/" 2>/dev/null || cp "$wh"/*.whl "$ctx/images/hub/wheelhouse/"
    [ -x "$repo/node_modules/.bin/configurable-http-proxy" ] \
      || die "hub: offline builds copy configurable-http-proxy from ./node_modules; run npm ci (scripts/setup.sh)"
    # node_modules/. : its contents also where node_modules is a link (a git worktree's)
    mkdir -p "$ctx/images/hub/vendor/node_modules"
    cp -a "$repo/node_modules/." "$ctx/images/hub/vendor/node_modules/"
  fi
  docker_build hub -f "$ctx/images/hub/Dockerfile" -t "$ns/hub:latest" "${oci_args[@]}" \
    --build-arg "BASE_IMAGE=$from" --build-arg "BUILD_FINGERPRINT=$fp" "$ctx"
  replace_leftover "$replaced" "$ns/hub:latest"
  outcome[hub]="built"
  seconds_taken[hub]=$((SECONDS - t0))
  say "hub: built $ns/hub:latest in ${seconds_taken[hub]}s"
}

build_postgres() {
  local t0=$SECONDS fp replaced standin
  standin="$(label "$POSTGRES_IMAGE" io.gpuhub.standin)"
  if [ -n "$(image_id "$POSTGRES_IMAGE")" ] && [ -z "$standin" ]; then
    say "postgres: $POSTGRES_IMAGE is a real image here; kept"
    outcome[postgres]="real image"
    return
  fi
  if [ "$mode" = online ] && [ "$local_base" = 0 ]; then
    say "postgres: pulling $POSTGRES_IMAGE"
    docker pull -q "$POSTGRES_IMAGE" >/dev/null
    outcome[postgres]="pulled"
    return
  fi
  ensure_local_base "$POSTGRES_LOCAL_BASE" "$repo/tests/standins/postgres/os-packages.txt"
  fp="$(fingerprint_paths tests/standins/postgres -- "$(image_id "$POSTGRES_LOCAL_BASE")")"
  if current postgres "$POSTGRES_IMAGE" "$fp"; then
    say "postgres: stand-in $POSTGRES_IMAGE is up to date"
    outcome[postgres]="up to date (stand-in)"
    return
  fi
  say "postgres: building the stand-in $POSTGRES_IMAGE from Debian's postgresql"
  replaced="$(image_id "$POSTGRES_IMAGE")"
  docker_build postgres -t "$POSTGRES_IMAGE" --build-arg "BASE_IMAGE=$POSTGRES_LOCAL_BASE" \
    --build-arg "BUILD_FINGERPRINT=$fp" "$repo/tests/standins/postgres"
  replace_leftover "$replaced" "$POSTGRES_IMAGE"
  outcome[postgres]="built (stand-in)"
  seconds_taken[postgres]=$((SECONDS - t0))
  say "postgres: built the stand-in $POSTGRES_IMAGE in ${seconds_taken[postgres]}s"
}

# --- run ---------------------------------------------------------------------------------------

if want base || want pytorch || want tensorflow; then
  build_base
fi
if want pytorch || want tensorflow; then
  if [ "$(label "$ns/base:latest" io.gpuhub.cuda.version)" = none ]; then
    base_variant=cpu
  else
    base_variant=cuda
  fi
  if [ -z "$variant" ]; then
    variant=$base_variant
    variant_defaults "$variant"
  fi
fi
if want pytorch; then
  torch_args=("TORCH_VERSION=$TORCH_VERSION" "TORCH_CUDA_VERSION=$TORCH_CUDA_VERSION")
  [ "$mode" = offline ] || torch_args+=("TORCH_INDEX_URL=$TORCH_INDEX_URL")
  build_framework pytorch "torch==$TORCH_VERSION" "${torch_args[@]}"
fi
if want tensorflow; then
  build_framework tensorflow "$TENSORFLOW_PACKAGE==$TENSORFLOW_VERSION" \
    "TENSORFLOW_PACKAGE=$TENSORFLOW_PACKAGE" "TENSORFLOW_VERSION=$TENSORFLOW_VERSION" \
    "TENSORFLOW_CUDA_VERSION=$TENSORFLOW_CUDA_VERSION"
fi
if want hub; then build_hub; fi
if want postgres; then build_postgres; fi

# --- summary -----------------------------------------------------------------------------------

say "done in $((SECONDS - started))s"
printf '\n%-24s %-8s %-22s %-8s %-10s %-22s %-6s\n' IMAGE SIZE RESULT PYTHON JUPYTERHUB FRAMEWORK CUDA
for name in base pytorch tensorflow; do
  [ -n "${outcome[$name]:-}" ] || continue
  img="$ns/$name:latest"
  result="${outcome[$name]}"
  [ -z "${seconds_taken[$name]:-}" ] || result="$result in ${seconds_taken[$name]}s"
  framework="$(label "$img" io.gpuhub.framework)"
  [ "$framework" = none ] || framework="$framework $(label "$img" io.gpuhub.framework.version)"
  printf '%-24s %-8s %-22s %-8s %-10s %-22s %-6s\n' "$img" \
    "$(docker image inspect -f '{{.Size}}' "$img" | numfmt --to=si --format=%.1f)" "$result" \
    "$(label "$img" io.gpuhub.python.version)" "$(label "$img" io.gpuhub.jupyterhub.version)" \
    "$framework" "$(label "$img" io.gpuhub.cuda.version)"
done
for name in hub postgres; do
  [ -n "${outcome[$name]:-}" ] || continue
  if [ "$name" = hub ]; then img="$ns/hub:latest"; else img=$POSTGRES_IMAGE; fi
  result="${outcome[$name]}"
  [ -z "${seconds_taken[$name]:-}" ] || result="$result in ${seconds_taken[$name]}s"
  printf '%-24s %-8s %-22s\n' "$img" \
    "$(docker image inspect -f '{{.Size}}' "$img" | numfmt --to=si --format=%.1f)" "$result"
done
