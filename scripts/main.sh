#!/usr/bin/env bash
# The README's main-job command: install what is missing, build hcbench (Release) and run
# the default policy comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --workflow --preset release >/dev/null
./build/release/tools/hcbench models "$@"
