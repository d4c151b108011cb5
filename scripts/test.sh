#!/usr/bin/env bash
# The README's test command: install what is missing, build every test (Debug, -Werror,
# CUDA device tests too when nvcc exists) and run them all.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --workflow --preset tests
