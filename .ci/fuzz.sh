#!/usr/bin/env bash
# Fuzzing stage: builds the libFuzzer harnesses of tests/fuzz with clang
# (-fsanitize=fuzzer,address,undefined) in a separate build dir, replays every regression
# input (tests/fuzz/regressions/<target>/), then fuzzes each target for FUZZ_SECONDS
# (default 8 s each, 11 targets, two at a time: ~50 s in all) from a copy of its seed corpus
# (tests/fuzz/corpus/<target>/). Any crash, leak, timeout, out-of-memory or sanitizer report
# exits non-zero; the crashing input is left in $BUILD/findings/<target>/ to be committed
# as a regression input.
#   FUZZ_SECONDS=N   seconds per target      FUZZ_BUILD=DIR  build dir (default build/fuzz)
#   FUZZ_JOBS=N      build parallelism, and how many targets fuzz at once (default 2: libFuzzer
#                    runs one process per target on one core, so on CI's 2 cores two targets
#                    side by side each get the whole core they had alone, and the 11 x 8 s take
#                    ~50 s instead of ~100 s). Reports are printed in target order.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${FUZZ_SECONDS:-8}"
BUILD="${FUZZ_BUILD:-build/fuzz}"
JOBS="${FUZZ_JOBS:-2}"
targets=(marconi mooncake sharegpt azure cachepawl openai swe_agent tau_bench bpe byte_size tiers)
start=$(date +%s)

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DHYBRIDCACHE_BUILD_FUZZERS=ON -DHYBRIDCACHE_BUILD_TESTS=OFF -DHYBRIDCACHE_BUILD_TOOLS=OFF \
  -DHYBRIDCACHE_BUILD_BENCH=OFF -DHYBRIDCACHE_BUILD_EXAMPLES=OFF -DHYBRIDCACHE_INSTALL=OFF \
  -DHYBRIDCACHE_ENABLE_CUDA=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]/#/fuzz_}"
echo "fuzz: built in $(( $(date +%s) - start )) s"

# One target: its regression inputs, then FUZZ_SECONDS of fuzzing. Prints its report lines;
# exits non-zero on a finding.
fuzz_target() {
  local t="$1" status=0
  local bin="$BUILD/tests/fuzz/fuzz_$t"
  [ -x "$bin" ] || bin="$BUILD/fuzz_$t"
  local reg="tests/fuzz/regressions/$t"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
    "$bin" -runs=0 "$reg"/* >/dev/null 2>"$BUILD/$t.regressions.log" || {
      echo "fuzz: $t: a regression input fails again:"; grep -m1 -A40 -E '^==[0-9]+==ERROR|runtime error|deadly signal' "$BUILD/$t.regressions.log" || tail -30 "$BUILD/$t.regressions.log"; status=1; }
  fi
  local work="$BUILD/corpus/$t"
  rm -rf "$work" && mkdir -p "$work" "$BUILD/findings/$t"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  if ! "$bin" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$BUILD/findings/$t/" "$work" >"$BUILD/$t.log" 2>&1; then
    # The report's head (what and where: the stack frames) and the fuzzer's last lines.
    echo "fuzz: $t: FINDING (input in $BUILD/findings/$t/):"
    grep -m1 -A40 -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|deadly signal' "$BUILD/$t.log" | grep -v -E '^  0x|Shadow|^ *(Addressable|Partially|Heap|Freed|Stack|Global|Poisoned|Container|Array|Intra|ASan|Left|Right)' || true
    echo "..."; tail -8 "$BUILD/$t.log"
    # The input itself (escaped, first 2 KB), so a finding on a CI machine can be committed.
    for f in "$BUILD/findings/$t"/*; do
      [ -f "$f" ] && python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); print(len(d), "bytes:", repr(d[:2048]))' "$f"
    done
    status=1
  else
    echo "fuzz: $t: $(grep -m1 'stat::number_of_executed_units' "$BUILD/$t.log" | awk '{print $2}') runs, no finding"
  fi
  return $status
}

# JOBS targets at a time; each writes its report to $BUILD/$t.report and its exit status to
# $BUILD/$t.rc, printed below in target order once all are done.
for t in "${targets[@]}"; do
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  rm -f "$BUILD/$t.rc"
  ( rc=0; fuzz_target "$t" >"$BUILD/$t.report" 2>&1 || rc=$?; echo "$rc" >"$BUILD/$t.rc" ) &
done
wait
status=0
for t in "${targets[@]}"; do
  cat "$BUILD/$t.report"
  [ "$(cat "$BUILD/$t.rc" 2>/dev/null)" = 0 ] || status=1
done
echo "fuzz: done in $(( $(date +%s) - start )) s (status $status)"
exit $status
