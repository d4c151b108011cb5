#!/usr/bin/env bash
# The README's test command: install what is missing, build llama.cpp and the llama test models
# (scripts/llama.sh: a pinned PyPI sdist, built and cached outside the tree, several minutes the
# first time, seconds after), build every test (Debug, -Werror, CUDA device tests too when nvcc
# exists) and run them all. HYBRIDCACHE_SKIP_LLAMA=1 leaves llama.cpp out (its tests are then
# not defined).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ "${HYBRIDCACHE_SKIP_LLAMA:-0}" != 1 ]; then
  llama_out="$(HYBRIDCACHE_LLAMA_PROGRAM=0 bash scripts/llama.sh)"
  HYBRIDCACHE_LLAMA_PREFIX="$(sed -n 's/^prefix=//p' <<<"$llama_out")"
  HYBRIDCACHE_LLAMA_MODELS="$(sed -n 's/^models=//p' <<<"$llama_out")"
  HYBRIDCACHE_LLAMA_SERVER="$(sed -n 's/^server=//p' <<<"$llama_out")"
  export HYBRIDCACHE_LLAMA_PREFIX HYBRIDCACHE_LLAMA_MODELS HYBRIDCACHE_LLAMA_SERVER
  echo "test.sh: llama.cpp at $HYBRIDCACHE_LLAMA_PREFIX, test models in $HYBRIDCACHE_LLAMA_MODELS" >&2
fi
cmake --workflow --preset tests
