#!/usr/bin/env bash
# Installs what hybridcache's build, tests and tools need on a fresh Debian machine, and
# nothing that is already there. Debian packages only; nothing is downloaded elsewhere.
# libclang-rt-14-dev: the sanitizer and libFuzzer runtimes of clang 14 (only recommended by
# clang, and recommends are not installed here), needed by .ci/fuzz.sh.
# libhiredis-dev: the client of the opt-in Redis tier (hybridcache::redis); redis-server and
# redis-tools: the servers and redis-cli its tests start (ctest label backends).
# libcpp-httplib-dev, pkg-config: the HTTP server of hybridcache-llama (examples/llama_cpp).
# python3-dev: Python.h for the Python module (python/, docs/python.md).
set -euo pipefail
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake ninja-build g++ clang doctest-dev libcli11-dev libbenchmark-dev python3 python3-venv zlib1g-dev libclang-rt-14-dev \
         libhiredis-dev redis-server redis-tools libcpp-httplib-dev pkg-config python3-dev; do
  have_pkg "$p" || need+=("$p")
done
if ((${#need[@]})); then
  echo "install-deps: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# nvcc is optional: CUDA headers and device tests are built when it is on PATH or in
# /usr/local/cuda (the toolkit is not a Debian package here).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: note: add /usr/local/cuda/bin to PATH to build the CUDA parts" >&2
fi

# The Python module's build and tests (python/, docs/python.md): a venv of exact PyPI versions,
# installed without dependencies (this list is all of them), made again only when the pins or
# the interpreter change, so a second run costs one comparison. CMake's tests preset finds it
# at this path (HYBRIDCACHE_PYTHON, python/CMakeLists.txt).
PY_VENV="${HYBRIDCACHE_CACHE:-$HOME/.cache/hybridcache}/python"
PY_PINS=(nanobind==3.1.0 scikit-build-core==1.1.2 packaging==26.3 pathspec==1.1.1
         pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 numpy==2.4.6 tokenizers==0.23.3)
py_stamp="$(python3 -c 'import sys; print(sys.executable, sys.version.split()[0])') ${PY_PINS[*]}"
if [ "$(cat "$PY_VENV/stamp" 2>/dev/null)" != "$py_stamp" ]; then
  echo "install-deps: making the Python venv $PY_VENV (${PY_PINS[*]})" >&2
  rm -rf "$PY_VENV"
  mkdir -p "$(dirname "$PY_VENV")"
  python3 -m venv "$PY_VENV"
  "$PY_VENV/bin/python" -m pip install -q --no-deps --disable-pip-version-check "${PY_PINS[@]}"
  "$PY_VENV/bin/python" -c "import nanobind, scikit_build_core, pytest, numpy, tokenizers"
  printf '%s' "$py_stamp" >"$PY_VENV/stamp"
fi
