#!/usr/bin/env bash
# Sets up the Marconi reference simulator (ruipeterpan/marconi, CC BY-NC 4.0) in a scratch
# directory, for the side-by-side comparison in docs/replay.md. Nothing is copied into this
# repository; never run in CI.
#
#   scripts/reference/setup_reference.sh [SCRATCH=/tmp/marconi-ref] [MARCONI_GIT=<git dir or URL>]
#
# Needs Debian's python3 packages (the replay path imports numpy/scipy but does not use them):
#   apt-get install -y --no-install-recommends python3-numpy python3-scipy python3-pandas python3-tz python3-tqdm
# Afterwards:  export PYTHONPATH=$SCRATCH/stubs  and use /usr/bin/python3.
set -euo pipefail
SCRATCH=${1:-/tmp/marconi-ref}
MARCONI_GIT=${2:-https://github.com/ruipeterpan/marconi.git}
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
GEN=$REPO_ROOT/../shared/fixtures/marconi/gen_trace.py
mkdir -p "$SCRATCH/marconi" "$SCRATCH/stubs/transformers" "$SCRATCH/stubs/datasets" "$SCRATCH/traces"
if [ -d "$MARCONI_GIT" ]; then            # a bare mirror / .git directory
  git --git-dir="$MARCONI_GIT" archive HEAD | tar -x -C "$SCRATCH/marconi"
else
  git clone --depth 1 "$MARCONI_GIT" "$SCRATCH/marconi-clone"
  git -C "$SCRATCH/marconi-clone" archive HEAD | tar -x -C "$SCRATCH/marconi"
fi
# The replay path imports these names but never uses them.
echo 'AutoTokenizer = AutoModelForCausalLM = None' > "$SCRATCH/stubs/transformers/__init__.py"
printf 'def load_dataset(*args, **kwargs):\n    raise RuntimeError("datasets is stubbed")\n' > "$SCRATCH/stubs/datasets/__init__.py"
# The synth-v1 traces of anchors/marconi.md 1(i), and a 5x longer chat trace.
python3 "$GEN" --profile chat  --seed 1 --sessions 100 --session-gap-ms 2000 --out "$SCRATCH/traces/chat_s1_100.jsonl"
python3 "$GEN" --profile agent --seed 2 --sessions 100 --session-gap-ms 4000 --out "$SCRATCH/traces/agent_s2_100.jsonl"
python3 "$GEN" --profile chat  --seed 1 --sessions 500 --session-gap-ms 2000 --out "$SCRATCH/traces/chat_s1_500.jsonl"
python3 "$GEN" --profile chat  --seed 7 --sessions 12  --session-gap-ms 1000 --out "$SCRATCH/traces/chat_seed7.jsonl"
echo "reference in $SCRATCH/marconi, traces in $SCRATCH/traces; export PYTHONPATH=$SCRATCH/stubs"
