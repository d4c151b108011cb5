#!/usr/bin/env bash
# Installs what hybridcache's build, tests and tools need on a fresh Debian machine, and
# nothing that is already there. Debian packages only; nothing is downloaded elsewhere.
# libclang-rt-14-dev: the sanitizer and libFuzzer runtimes of clang 14 (only recommended by
# clang, and recommends are not installed here), needed by .ci/fuzz.sh.
# libhiredis-dev: the client of the opt-in Redis tier (hybridcache::redis); redis-server and
# redis-tools: the servers and redis-cli its tests start (ctest label backends).
# libcpp-httplib-dev, pkg-config: the HTTP server of hybridcache-llama (examples/llama_cpp).
set -euo pipefail
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake ninja-build g++ clang doctest-dev libcli11-dev libbenchmark-dev python3 python3-venv zlib1g-dev libclang-rt-14-dev \
         libhiredis-dev redis-server redis-tools libcpp-httplib-dev pkg-config; do
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
