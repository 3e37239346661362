#!/usr/bin/env bash
# `make image`: the project's Dockerfile, built for real on a machine with no Docker daemon and no
# container registry (docs/deploy.md, "The image, built and tested here"):
#
#   1. buildah, podman, runc and debootstrap from Debian (installed once; idempotent).
#   2. A STAND-IN base image for the AWS llama.cpp DLC, which cannot be pulled here: Debian minbase
#      (debootstrap from the mirror apt already uses) + a venv first on PATH (Debian's python refuses
#      `pip install`, PEP 668) + llama-cpp-python from the wheel scripts/setup.sh built for the venv.
#      That wheel carries THIS machine's CPU flags: the base is labelled a smoke-test base that must
#      never be pushed, and is kept (cached by what went into it) so a second run skips it.
#   3. The project's Dockerfile, unchanged, with --build-arg BASE_IMAGE=<the stand-in>; buildah's
#      layer cache makes an unchanged rebuild take seconds.
#
# Environment: SEMIF_IMAGE (the tag built, default localhost/semif:dev), SEMIF_VENV (default .venv).
# Running it (podman with runc, host networking, rlimits inside the sandbox's): deploy/local.py,
# `make image-test` and docs/deploy.md.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${SEMIF_IMAGE:-localhost/semif:dev}
VENV=${SEMIF_VENV:-.venv}
WHEELS=${SEMIF_WHEEL_CACHE:-$HOME/.cache/semif-workbench/wheels}
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,libgomp1,ca-certificates
NEVER_PUSH="smoke-test stand-in for the AWS llama.cpp DLC: carries the build machine's CPU flags; never push"

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

ensure_tools() {
  local missing="" t
  for t in buildah podman runc debootstrap; do command -v "$t" >/dev/null 2>&1 || missing="$missing $t"; done
  [ -z "$missing" ] && return 0
  log "installing from Debian:$missing (once)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq buildah podman runc debootstrap >/dev/null
}

mirror() {  # the Debian mirror apt already uses (deb822 sources first, then sources.list)
  local m
  m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 !~ /security/ {print ($2 ~ /^\[/ ? $4 : $2); exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

key() { sha256sum | cut -c1-12; }

# -- the Debian root filesystem (cached as an image by suite + packages + architecture) ---------------
ROOTFS_IMAGE="localhost/semif-smoke-rootfs:$(printf '%s|%s|%s' "$SUITE" "$BASE_PACKAGES" "$(uname -m)" | key)"
build_rootfs() {
  if podman image exists "$ROOTFS_IMAGE"; then log "rootfs cached: $ROOTFS_IMAGE"; return 0; fi
  local dir
  dir=$(mktemp -d /var/tmp/semif-rootfs.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$dir'" EXIT
  log "debootstrap $SUITE minbase from $(mirror) (~1-2.5 min)"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$dir" "$(mirror)" >/dev/null
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | podman import --change "LABEL org.semif.never-push=\"$NEVER_PUSH\"" - "$ROOTFS_IMAGE" >/dev/null
  rm -rf "$dir"; trap - EXIT
}

# -- the stand-in base: rootfs + venv + the wheel setup.sh built (cached by rootfs + wheel + recipe) ---
wheel() {  # the llama-cpp-python wheel the venv was installed from (setup.sh marks the venv with its folder)
  local mark dir
  mark=$(ls -d "$VENV"/.llama-* 2>/dev/null | head -n1 || true)
  [ -n "$mark" ] || die "no llama-cpp-python build recorded in $VENV: run make setup first"
  dir="$WHEELS/${mark##*/.}"
  ls "$dir"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || die "the wheel folder $dir is gone: run make setup"
}
base_recipe() {
  cat <<EOF
FROM $ROOTFS_IMAGE
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN python3 -m venv /opt/venv && pip install --no-cache-dir --quiet /semif-wheel/$(basename "$1")
LABEL org.semif.never-push="$NEVER_PUSH" org.semif.base="stand-in"
EOF
}
build_base() {
  local whl tag recipe
  whl=$(wheel)
  tag=$( (base_recipe "$whl"; sha256sum "$whl") | key)
  BASE_IMAGE="localhost/semif-smoke-base:$tag"
  if podman image exists "$BASE_IMAGE"; then log "stand-in base cached: $BASE_IMAGE"; return 0; fi
  log "stand-in base $BASE_IMAGE (venv + $(basename "$whl"))"
  recipe=$(mktemp -d /var/tmp/semif-base.XXXXXX)
  base_recipe "$whl" > "$recipe/Containerfile"
  buildah build --quiet --isolation chroot --network host -v /etc/ssl/certs:/etc/ssl/certs:ro \
    -v "$(dirname "$whl"):/semif-wheel:ro" -t "$BASE_IMAGE" "$recipe" >/dev/null
  rm -rf "$recipe"
}

# -- the project's image ------------------------------------------------------------------------------
source_tag() {  # the tag a SageMaker deployment of this tree would push (deploy/plan.py: src-<build context sha256>)
  "$VENV/bin/python" -c 'import sys, tempfile, pathlib
from deploy.package import make_build_context
with tempfile.TemporaryDirectory() as d:
    print("src-" + make_build_context(pathlib.Path(d) / "src.zip")[1][:12])'
}
build_image() {
  local tag
  tag=$(source_tag)
  log "building $IMAGE ($tag) from the Dockerfile (BASE_IMAGE=$BASE_IMAGE)"
  # --layers: unchanged steps (the pip install, the 1.1 GB default model) come from buildah's cache.
  # The host CA bundle is mounted for the RUN steps only (TLS to the registries is re-signed here).
  buildah build --layers --isolation chroot --network host -v /etc/ssl/certs:/etc/ssl/certs:ro \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --label org.semif.source="$tag" -t "$IMAGE" . >&2
  log "built $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1/1e9}'))"
}

timed() { local t; t=$(date +%s); "$1"; log "$1: $(( $(date +%s) - t )) s"; }
t0=$(date +%s)
timed ensure_tools
timed build_rootfs
timed build_base
timed build_image
log "done in $(( $(date +%s) - t0 )) s; make image-test runs it as SageMaker does (docs/deploy.md)"
