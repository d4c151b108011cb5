// Trace-replay loop time: the synth-v1 chat trace (seed 1, 100 sessions, 2 s apart: 692
// requests, the trace the Marconi reference was timed on, docs/replay.md) through each
// policy at 5e9 bytes, and the Mooncake conversation trace (12,031 requests, 512-token
// blocks) when ../shared is present. Each iteration builds a fresh cache and replays the
// whole trace; the trace is generated / parsed once, outside the timing.
//
//   build/rel/bench/bench_replay --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>
#include <vector>

#include <hybridcache/sim/mooncake_trace.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/sim/synth_v1.hpp>

#include "replay_bench.hpp"

namespace {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;
using replay_bench::run;
using replay_bench::heapq_lru;
using replay_bench::node_id_lru;
using replay_bench::flop_alpha1;
using replay_bench::flop_alpha0;

const hc::sim::replay_trace& chat_trace() {
  static const hc::sim::replay_trace t = [] {
    std::vector<hc::sim::request> rs;
    for (const auto& r : hc::sim::generate_synth_v1({.profile = hc::sim::synth_profile::chat, .seed = 1,
                                                      .sessions = 100, .session_gap_ms = 2000}))
      rs.push_back(r.to_request());
    return hc::sim::replay_trace(rs);
  }();
  return t;
}

const hc::sim::replay_trace* mooncake_trace() {
  static const std::unique_ptr<hc::sim::replay_trace> t = []() -> std::unique_ptr<hc::sim::replay_trace> {
    const std::filesystem::path p =
        std::filesystem::path(HYBRIDCACHE_SOURCE_DIR) / "../shared/data/traces/mooncake/conversation_trace.jsonl";
    if (!std::filesystem::exists(p)) return nullptr;
    hc::sim::mooncake_reader reader(p);
    std::vector<hc::sim::request> rs;
    hc::sim::request r;
    while (reader.next(r)) rs.push_back(r);
    return std::make_unique<hc::sim::replay_trace>(rs);
  }();
  return t.get();
}

void chat_sglang_plus(benchmark::State& s) { run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, heapq_lru); }
void chat_sglang_plus_node_id_ties(benchmark::State& s) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, node_id_lru);
}
void chat_vllm_plus(benchmark::State& s) { run<pc::every_block_admission<32>>(s, chat_trace(), 5'000'000'000, 1, heapq_lru); }
void chat_marconi_alpha1(benchmark::State& s) { run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, flop_alpha1); }
void chat_marconi_auto(benchmark::State& s) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, flop_alpha0, hc::compose::tuning_config{.threads = 1});
}
// The adaptive selector (what --policy marconi runs by default) against one fixed policy at
// the same capacity: issue #14's loop-time ratio, side by side in one run.
void chat_marconi_selector(benchmark::State& s) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, replay_bench::marconi_selector);
}

// Sampled shadows (issue #36): the selector at rate R (floor F: exact until R x the
// conversations the cache holds reaches F), against chat_marconi_alpha1 / mooncake/marconi_alpha1.
void chat_selector_sampled(benchmark::State& s, double rate, double floor,
                           pc::index_upkeep upkeep = pc::index_upkeep::followed) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1,
                               replay_bench::sampled_selector({.rate = rate, .min_sampled_conversations = floor}, 1, upkeep));
}
// At 50 GB the cache holds ~60-90 Mooncake conversations; at 300 GB ~340-410, where a 0.1
// sample holds enough for the floor of 16 (the rows' capacity is the last argument).
void mooncake_selector_sampled(benchmark::State& s, double rate, double floor, std::int64_t cap,
                               pc::index_upkeep upkeep = pc::index_upkeep::followed) {
  const auto* t = mooncake_trace();
  if (t == nullptr) {
    s.SkipWithError("../shared/data/traces/mooncake/conversation_trace.jsonl not found");
    return;
  }
  if (rate == 0.0) {  // the fixed policy at that capacity, for the ratio
    run<pc::judicious_admission>(s, *t, cap, 512, flop_alpha1);
    return;
  }
  run<pc::judicious_admission>(s, *t, cap, 512,
                               replay_bench::sampled_selector({.rate = rate, .min_sampled_conversations = floor}, 512, upkeep));
}

// The live switching scorer alone (no shadows) following FLOP-aware a1, each upkeep
// (issue #36: the live half's cost against chat_marconi_alpha1 / mooncake/marconi_alpha1).
void chat_switching_live(benchmark::State& s, pc::index_upkeep upkeep) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, replay_bench::switching_live(upkeep));
}
void mooncake_switching_live(benchmark::State& s, pc::index_upkeep upkeep) {
  const auto* t = mooncake_trace();
  if (t == nullptr) {
    s.SkipWithError("../shared/data/traces/mooncake/conversation_trace.jsonl not found");
    return;
  }
  run<pc::judicious_admission>(s, *t, 50'000'000'000, 512, replay_bench::switching_live(upkeep));
}

void mooncake(benchmark::State& s, int policy) {
  const auto* t = mooncake_trace();
  if (t == nullptr) {
    s.SkipWithError("../shared/data/traces/mooncake/conversation_trace.jsonl not found");
    return;
  }
  const std::int64_t cap = 50'000'000'000;  // 50 GB; 512-token ids
  switch (policy) {
    case 0: run<pc::judicious_admission>(s, *t, cap, 512, heapq_lru); break;
    case 1: run<pc::every_block_admission<1>>(s, *t, cap, 512, heapq_lru); break;
    case 2: run<pc::judicious_admission>(s, *t, cap, 512, flop_alpha1); break;
    default: run<pc::judicious_admission>(s, *t, cap, 512, replay_bench::marconi_selector); break;
  }
}

}  // namespace

BENCHMARK(chat_sglang_plus)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_sglang_plus_node_id_ties)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_vllm_plus)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_marconi_alpha1)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_marconi_auto)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_marconi_selector)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, sglang_plus, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, vllm_plus, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, marconi_alpha1, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, marconi_selector, 3)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_selector_sampled, r0_1, 0.1, 0.0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_selector_sampled, r0_05, 0.05, 0.0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_selector_sampled, r0_1_floor16, 0.1, 16.0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_selector_sampled, r0_01, 0.01, 0.0)->Unit(benchmark::kMillisecond);
// (R = 0.001 cannot run here: 5e9 x 0.001 is smaller than one checkpoint.)
BENCHMARK_CAPTURE(chat_selector_sampled, r0_01_every_part, 0.01, 0.0, pc::index_upkeep::every_part)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_selector_sampled, exact_every_part, 1.0, 0.0, pc::index_upkeep::every_part)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_switching_live, followed, pc::index_upkeep::followed)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(chat_switching_live, every_part, pc::index_upkeep::every_part)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_1, 0.1, 0.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_05, 0.05, 0.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_1_floor16, 0.1, 16.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
// Rates 0.01 / 0.001 (a handful of requests sampled): what the live switching scorer and the hash cost alone.
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_01, 0.01, 0.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_001, 0.001, 0.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, r0_001_every_part, 0.001, 0.0, 50'000'000'000, pc::index_upkeep::every_part)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, exact, 1.0, 0.0, 50'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, exact_every_part, 1.0, 0.0, 50'000'000'000, pc::index_upkeep::every_part)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_switching_live, followed, pc::index_upkeep::followed)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_switching_live, every_part, pc::index_upkeep::every_part)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, 300GB_alpha1, 0.0, 0.0, 300'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, 300GB_exact, 1.0, 0.0, 300'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake_selector_sampled, 300GB_r0_1_floor16, 0.1, 16.0, 300'000'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
