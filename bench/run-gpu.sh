#!/usr/bin/env bash
# One command for a machine with a GPU: builds (release-cuda preset) and runs the device
# tests and the linear-attention benchmark, keeping their output in build/release-cuda/gpu-run/.
# The benchmark prints the efficiency against the roofline model (bench/roofline.hpp) and
# whether recurrent decode reaches 80 % of the published HBM bandwidth at batch >= 64. Where
# compute-sanitizer is installed it then runs the device tests under memcheck, racecheck,
# synccheck and initcheck and fails on any error (memcheck leaves out the API errors the tests
# provoke on purpose; initcheck checks device-side reads only: the tests download whole,
# partly written buffers, which it would report as host accesses). HYBRIDCACHE_GPU_SANITIZE=0
# skips that step.
#   bash bench/run-gpu.sh [benchmark arguments, e.g. --batches 64,256 --reps 9]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset release-cuda >/dev/null
cmake --build build/release-cuda --target hybridcache_test_cuda bench_linear_attention
out=build/release-cuda/gpu-run
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$out/device.csv" || true
ctest --test-dir build/release-cuda -R '^cuda$' --output-on-failure | tee "$out/device-tests.txt"
./build/release-cuda/bench/bench_linear_attention "$@" | tee "$out/bench_linear_attention.txt"
if [ "${HYBRIDCACHE_GPU_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  exe=build/release-cuda/tests/cuda/hybridcache_test_cuda
  sanitize() {  # sanitize TOOL [sanitizer options] -- [test options]
    local tool=$1 log="$out/$1.txt" opts=() args=()
    shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    if compute-sanitizer --tool "$tool" "${opts[@]}" --error-exitcode 9 "$exe" "${args[@]}" > "$log" 2>&1; then
      grep -E 'SUMMARY' "$log" | sed "s/^/$tool: /"
    else
      tail -n 40 "$log"; echo "compute-sanitizer $tool: errors (full log: $log)"; exit 1
    fi
  }
  sanitize memcheck --report-api-errors no
  sanitize racecheck
  sanitize synccheck
  sanitize initcheck --check-api-memory-access no -- -tc='device:*'
fi
echo "results in $out/"
