#!/usr/bin/env bash
# One command for a machine with a GPU: builds (release-cuda preset) and runs the device
# tests and the linear-attention benchmark, keeping their output in build/release-cuda/gpu-run/.
# The benchmark prints the efficiency against the roofline model (bench/roofline.hpp) and
# whether recurrent decode reaches 80 % of the published HBM bandwidth at batch >= 64.
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
echo "results in $out/"
