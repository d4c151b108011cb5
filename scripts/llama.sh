#!/usr/bin/env bash
# llama.cpp for hybridcache's llama tests and programs, built from a pinned PyPI sdist into a
# cache directory outside the source tree (nothing of llama.cpp enters this repository):
#
#   1. downloads llama-cpp-python==0.3.36's sdist (its vendor/llama.cpp is llama.cpp 0.5.0-dev,
#      ggml 0.25.3) with pip and checks its sha256 against the hash pinned below, unpacks it;
#   2. builds CPU-only libllama (+ ggml) and llama-server from it (Release, Ninja, -march=native)
#      and installs libllama's headers, libraries and CMake package (`find_package(llama)`)
#      into a prefix;
#   3. makes a Python venv with pinned packages: numpy, tokenizers (the version
#      tests/tokenizer/hf_exact.py is measured with), jinja2, and the sdist's own gguf-py;
#   4. writes the random-weight test models with scripts/llama_models.py;
#   5. builds our program hybridcache-llama (examples/llama_cpp, Release) against the prefix.
#
# Each step is reused when its stamp (the version, hashes and flags it was made from) matches,
# so a second run takes seconds. The last lines on stdout are
#   models=DIR          tokenizer.json, chat_cases.txt and the models
#   prefix=PATH         the llama install prefix (CMake: -DHYBRIDCACHE_LLAMA_PREFIX=PATH)
#   program=PATH        hybridcache-llama
#   server=PATH         llama-server
#   model.NAME=PATH     one per model (qwen35, nemotron_h)
# Progress goes to stderr, build logs into the cache.
#
# Environment: HYBRIDCACHE_CACHE (default ~/.cache/hybridcache), HYBRIDCACHE_LLAMA_JOBS
# (build jobs, default 2), HYBRIDCACHE_LLAMA_PROGRAM=0 (skip step 5 and the program= line: the
# test command builds its own Debug program in the test tree), HYBRIDCACHE_TRACES (the trace the vocabulary is trained on; default
# ../shared/data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl beside the checkout).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HYBRIDCACHE_CACHE:-$HOME/.cache/hybridcache}"
JOBS="${HYBRIDCACHE_LLAMA_JOBS:-2}"
TRACES="${HYBRIDCACHE_TRACES:-$ROOT/../shared/data/traces/sharegpt_zh_1k/sharegpt_zh_1K_format.jsonl}"

SDIST_NAME=llama-cpp-python
SDIST_VERSION=0.3.36
SDIST_FILE=llama_cpp_python-$SDIST_VERSION.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# Python packages of the venv, exact versions (installed without dependencies: this is all).
PY_PINS=(numpy==2.4.6 tokenizers==0.23.3 pyyaml==6.0.3 jinja2==3.1.6 markupsafe==3.0.2 poetry-core==2.2.1)
# The build: CPU only; no UI, OpenSSL or app (the UI flags stop a download at configure time);
# only what the tests and llama-server need. Installed libraries find each other ($ORIGIN).
LLAMA_CMAKE_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_TOOLS_INSTALL=OFF '-DCMAKE_INSTALL_RPATH=$ORIGIN')
LLAMA_TARGETS=(llama llama-server)

log() { echo "llama.sh: $*" >&2; }
die() { echo "llama.sh: error: $*" >&2; exit 1; }
hash_of() { sha256sum | cut -c1-16; }
# Runs a logged step; on failure shows the end of its log.
run_logged() {
  local logf=$1; shift
  if ! "$@" >"$logf" 2>&1; then
    tail -n 40 "$logf" >&2
    die "failed: $* (log: $logf)"
  fi
}

for tool in python3 cmake ninja c++ sha256sum tar flock; do
  command -v "$tool" >/dev/null || die "$tool is not installed (scripts/install-deps.sh installs the build tools)"
done
[ -f "$TRACES" ] || die "trace $TRACES not found (set HYBRIDCACHE_TRACES)"

mkdir -p "$CACHE"
exec 9>"$CACHE/.llama.lock"
flock 9  # one run at a time per cache directory
t_start=$(date +%s)

# --- 1. the sdist -------------------------------------------------------------------------
SDIST="$CACHE/dl/$SDIST_FILE"
if [ ! -f "$SDIST" ] || [ "$(sha256sum "$SDIST" | cut -d' ' -f1)" != "$SDIST_SHA256" ]; then
  log "downloading $SDIST_NAME==$SDIST_VERSION (sdist) from PyPI"
  tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
  run_logged "$CACHE/download.log" python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
    -d "$tmp" "$SDIST_NAME==$SDIST_VERSION"
  [ -f "$tmp/$SDIST_FILE" ] || die "pip did not produce $SDIST_FILE"
  got="$(sha256sum "$tmp/$SDIST_FILE" | cut -d' ' -f1)"
  [ "$got" = "$SDIST_SHA256" ] || { rm -rf "$tmp"; die "$SDIST_FILE has sha256 $got, expected $SDIST_SHA256"; }
  mkdir -p "$CACHE/dl"
  mv "$tmp/$SDIST_FILE" "$SDIST"
  rm -rf "$tmp"
fi
SRC="$CACHE/src/llama_cpp_python-$SDIST_VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"
if [ "$(cat "$SRC/.hybridcache-unpacked" 2>/dev/null)" != "$SDIST_SHA256" ]; then
  log "unpacking $SDIST_FILE"
  rm -rf "$SRC"
  mkdir -p "$CACHE/src"
  tar -xzf "$SDIST" -C "$CACHE/src"
  [ -f "$LLAMA_SRC/include/llama.h" ] || die "$SDIST_FILE has no vendor/llama.cpp"
  echo "$SDIST_SHA256" >"$SRC/.hybridcache-unpacked"
fi

# --- 2. libllama + llama-server ------------------------------------------------------------
# The stamp: what the build depends on. GGML_NATIVE compiles for this CPU, so its flags count.
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | hash_of || true)"
build_stamp="$(printf '%s\n' "sdist $SDIST_FILE $SDIST_SHA256" "cmake ${LLAMA_CMAKE_FLAGS[*]}" \
  "targets ${LLAMA_TARGETS[*]}" "cxx $(c++ --version | head -n1)" "cmake-version $(cmake --version | head -n1)" \
  "cpu $cpu_flags")"
BKEY="$(printf '%s' "$build_stamp" | hash_of)"
LDIR="$CACHE/llama/$BKEY"
BUILD="$LDIR/build"
PREFIX="$LDIR/prefix"
SERVER="$BUILD/bin/llama-server"
if [ "$(cat "$LDIR/stamp" 2>/dev/null)" != "$build_stamp" ] || [ ! -x "$SERVER" ] ||
   [ ! -f "$PREFIX/lib/cmake/llama/llama-config.cmake" ]; then
  log "building libllama + llama-server in $BUILD ($JOBS jobs; several minutes on 2 cores)"
  t0=$(date +%s)
  rm -f "$LDIR/stamp"
  mkdir -p "$LDIR"
  run_logged "$LDIR/configure.log" cmake -S "$LLAMA_SRC" -B "$BUILD" "${LLAMA_CMAKE_FLAGS[@]}"
  run_logged "$LDIR/build.log" cmake --build "$BUILD" -j "$JOBS" --target "${LLAMA_TARGETS[@]}"
  # Install only libllama (top-level rules, no subdirectories: the tools were not all built) and
  # ggml, then check that the package config is there.
  rm -rf "$PREFIX"
  run_logged "$LDIR/install.log" cmake -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LOCAL_ONLY=ON -P "$BUILD/cmake_install.cmake"
  run_logged "$LDIR/install-ggml.log" cmake -DCMAKE_INSTALL_PREFIX="$PREFIX" -P "$BUILD/ggml/cmake_install.cmake"
  [ -f "$PREFIX/include/llama.h" ] && [ -f "$PREFIX/lib/cmake/llama/llama-config.cmake" ] &&
    [ -f "$PREFIX/lib/cmake/ggml/ggml-config.cmake" ] || die "the install into $PREFIX is incomplete"
  [ -x "$SERVER" ] || die "llama-server was not built"
  printf '%s' "$build_stamp" >"$LDIR/stamp"
  log "built in $(( $(date +%s) - t0 )) s"
fi

# --- 3. the venv ---------------------------------------------------------------------------
py_version="$(python3 -c 'import sys; print(sys.version.split()[0])')"
venv_stamp="$(printf '%s\n' "python $py_version" "pins ${PY_PINS[*]}" "gguf-py from $SDIST_FILE $SDIST_SHA256")"
VKEY="$(printf '%s' "$venv_stamp" | hash_of)"
VENV="$CACHE/venv/$VKEY"
PY="$VENV/bin/python"
if [ "$(cat "$VENV/stamp" 2>/dev/null)" != "$venv_stamp" ]; then
  log "creating the venv $VENV (${PY_PINS[*]}, gguf-py)"
  rm -rf "$VENV"
  mkdir -p "$CACHE/venv"
  run_logged "$CACHE/venv/$VKEY.log" python3 -m venv "$VENV"
  run_logged "$CACHE/venv/$VKEY.log" "$PY" -m pip install -q --no-deps --disable-pip-version-check "${PY_PINS[@]}"
  run_logged "$CACHE/venv/$VKEY.gguf.log" "$PY" -m pip install -q --no-deps --no-build-isolation \
    --disable-pip-version-check "$LLAMA_SRC/gguf-py"
  run_logged "$CACHE/venv/$VKEY.check.log" "$PY" -c "import gguf, numpy, tokenizers, jinja2"
  printf '%s' "$venv_stamp" >"$VENV/stamp"
fi

# --- 4. the test models --------------------------------------------------------------------
# Keyed on the scripts that make them, the trace they are trained on and the venv.
models_stamp="$(printf '%s\n' "venv $VKEY" \
  "models $(hash_of <"$ROOT/scripts/llama_models.py")" \
  "tokenizer $(hash_of <"$ROOT/scripts/train_bpe_tokenizer.py")" \
  "trace $(hash_of <"$TRACES")")"
MKEY="$(printf '%s' "$models_stamp" | hash_of)"
MODELS="$CACHE/models/$MKEY"
if [ "$(cat "$MODELS/stamp" 2>/dev/null)" != "$models_stamp" ]; then
  log "writing the test models into $MODELS"
  rm -rf "$MODELS" "$MODELS.tmp"
  mkdir -p "$MODELS.tmp"
  run_logged "$CACHE/models/$MKEY.log" "$PY" "$ROOT/scripts/llama_models.py" --out "$MODELS.tmp" --traces "$TRACES"
  mv "$MODELS.tmp" "$MODELS"
  printf '%s' "$models_stamp" >"$MODELS/stamp"
fi

# --- 5. hybridcache-llama ------------------------------------------------------------------
# Our program (examples/llama_cpp), Release, against the prefix; incremental (ninja) on every
# run, so it follows the checkout. Keyed by the checkout's path and the llama build.
PROGRAM=
if [ "${HYBRIDCACHE_LLAMA_PROGRAM:-1}" != 0 ]; then
  PKEY="$(printf '%s' "$ROOT $BKEY" | hash_of)"
  PBUILD="$CACHE/program/$PKEY"
  PROGRAM="$PBUILD/examples/llama_cpp/hybridcache-llama"
  mkdir -p "$PBUILD"
  if [ ! -f "$PBUILD/CMakeCache.txt" ]; then
    log "configuring hybridcache-llama in $PBUILD"
    run_logged "$PBUILD/configure.log" cmake -S "$ROOT" -B "$PBUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DHYBRIDCACHE_BUILD_EXAMPLES=ON -DHYBRIDCACHE_ENABLE_CUDA=OFF -DHYBRIDCACHE_LLAMA_PREFIX="$PREFIX"
  fi
  run_logged "$PBUILD/build.log" cmake --build "$PBUILD" -j "$JOBS" --target hybridcache-llama
  [ -x "$PROGRAM" ] || die "hybridcache-llama was not built (log: $PBUILD/build.log)"
fi

log "ready in $(( $(date +%s) - t_start )) s"
echo "models=$MODELS"
echo "prefix=$PREFIX"
[ -z "$PROGRAM" ] || echo "program=$PROGRAM"
echo "server=$SERVER"
while IFS='=' read -r name file; do
  [ -f "$MODELS/$file" ] || die "model $name ($MODELS/$file) is missing"
  echo "model.$name=$MODELS/$file"
done <"$MODELS/models.txt"
