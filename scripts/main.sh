#!/usr/bin/env bash
# The README's main-job command: install what is missing, build hcbench (Release) and run
# the default policy comparison: the embedded synth-v1 chat and agent workloads through
# marconi, sglang+, vllm+ and lru at 1-10 GB, printing a table and writing results.csv,
# table.txt and hit_rate_vs_capacity.svg into hcbench-results/. Extra arguments go to
# `hcbench compare` (e.g. --trace FILE --format mooncake --capacities 1e11,1e12 --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target hcbench >/dev/null
./build/release/tools/hcbench compare "$@"
