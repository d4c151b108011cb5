#!/usr/bin/env bash
# Resource gate of the CUDA kernels: compiles every kernel instantiation the library ships
# (.ci/ptxas_kernels.def, instantiated in .ci/ptxas_kernels.cu) for sm_80 and sm_90 with
# -Xptxas -v, adds the dynamic shared memory the launchers ask for at the largest supported
# shape (.ci/ptxas_shared.cpp, the launchers' own shape functions), and fails on any spill,
# on shared memory over the per-block limit, on a fold_row that nvcc may re-contract, or on
# recurrent decode without 128-bit state loads. Prints the table of registers, shared memory
# and theoretical occupancy kept in docs/linear-attention.md. About 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
if ! command -v nvcc >/dev/null; then
  echo "check-ptxas: nvcc not found; skipped"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
g++ -std=c++20 -O1 -Iinclude -I.ci .ci/ptxas_shared.cpp -o "$work/shared"
"$work/shared" > "$work/shared.txt"
for arch in 80 90; do
  nvcc -std=c++20 -gencode "arch=compute_${arch},code=sm_${arch}" -Xptxas -v -Iinclude -I.ci -keep -keep-dir "$work" \
    -c .ci/ptxas_kernels.cu -o "$work/k${arch}.o" > "$work/ptxas${arch}.raw" 2>&1 || { cat "$work/ptxas${arch}.raw"; exit 1; }
  c++filt < "$work/ptxas${arch}.raw" > "$work/ptxas${arch}.txt"
done
ptx=$(ls "$work"/*.ptx | grep -E 'compute_90|sm_90' | head -n 1 || true)
[ -n "$ptx" ] || ptx=$(ls -t "$work"/*.ptx | head -n 1)
python3 .ci/ptxas_report.py "$work/shared.txt" "$work/ptxas80.txt" "$work/ptxas90.txt" "$ptx"
