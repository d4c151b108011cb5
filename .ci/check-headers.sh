#!/usr/bin/env bash
# Header self-containment check, generated from the file list (a new header is covered
# without editing this script):
#   every runtime .hpp (include/) compiles alone with g++ -std=c++20 and clang++ -std=c++20
#   with only include/ on the include path, so a runtime header that reaches into the
#   simulation harness fails here;
#   every harness .hpp (sim/include/) compiles alone with g++ and include/ + sim/include/
#   (the harness is built by our own CMake with g++; users' compilers meet the runtime only);
#   every .cuh compiles alone with nvcc -std=c++20 for sm_80 (compile only: whether it
#   includes what it uses; .ci/check-ptxas.sh compiles every kernel for sm_80 and sm_90);
#   the opt-in Redis tier (*/redis/*.hpp) compiles alone too, with hiredis's headers from the
#   system include path; where hiredis is not installed those headers are reported skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=${HEADER_CHECK_JOBS:-2}

check_host() {  # $1 = compiler, $2 = header path relative to include/ or sim/include/
  local tu="$work/$(echo "$1_$2" | tr '/.+' '___').cpp"
  local inc="-Iinclude"
  case "$2" in hybridcache/sim/*) inc="-Iinclude -Isim/include" ;; esac
  printf '#include <%s>\n#include <%s>\n' "$2" "$2" > "$tu"  # twice: include guards / pragma once
  # shellcheck disable=SC2086
  if ! "$1" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror $inc "$tu" 2>"$tu.log"; then
    echo "FAIL $1 $2"; cat "$tu.log"; return 1
  fi
  echo "ok   $1 $2"
}
check_cuda() {  # $1 = header path relative to include/
  local tu="$work/$(echo "nvcc_$1" | tr '/.+' '___').cu"
  printf '#include <%s>\n#include <%s>\n' "$1" "$1" > "$tu"
  if ! nvcc -std=c++20 -gencode arch=compute_80,code=sm_80 \
       -Iinclude -c "$tu" -o "$tu.o" 2>"$tu.log"; then
    echo "FAIL nvcc $1"; cat "$tu.log"; return 1
  fi
  echo "ok   nvcc $1"
}
export -f check_host check_cuda
export work

hpp=$( { (cd include && find hybridcache -name '*.hpp'); (cd sim/include && find hybridcache -name '*.hpp'); } | sort)
if ! printf '#include <hiredis/hiredis.h>\n' | g++ -x c++ -fsyntax-only - 2>/dev/null; then
  for h in $hpp; do case "$h" in */redis/*) echo "skip $h (hiredis not installed)" ;; esac; done
  hpp=$(printf '%s\n' $hpp | grep -v '/redis/' || true)
fi
cuh=$(cd include && find hybridcache -name '*.cuh' | sort)
status=0
{ for h in $hpp; do echo "g++ $h"; case "$h" in hybridcache/sim/*) ;; *) echo "clang++ $h" ;; esac; done; } |
  xargs -P "$jobs" -n 2 bash -c 'check_host "$0" "$1"' || status=1
if [ -n "$cuh" ]; then
  if command -v nvcc >/dev/null; then
    printf '%s\n' $cuh | xargs -P "$jobs" -n 1 bash -c 'check_cuda "$0"' || status=1
  else
    echo "FAIL: .cuh headers present but nvcc not found"; status=1
  fi
fi
n_hpp=$(printf '%s\n' $hpp | grep -c . || true)
n_cuh=$(printf '%s\n' $cuh | grep -c . || true)
if [ "$status" -eq 0 ]; then
  echo "header check: ${n_hpp} .hpp x g++ (the runtime's x clang++ too) and ${n_cuh} .cuh x nvcc sm_80: all self-contained"
else
  echo "header check FAILED"
fi
exit "$status"
