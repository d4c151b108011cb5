// Trace-replay loop time: the synth-v1 chat trace (seed 1, 100 sessions, 2 s apart: 692
// requests, the trace the Marconi reference was timed on, docs/replay.md) through each
// policy at 5e9 bytes, and the Mooncake conversation trace (12,031 requests, 512-token
// blocks) when ../shared is present. Each iteration builds a fresh cache and replays the
// whole trace; the trace is generated / parsed once, outside the timing.
//
//   build/rel/bench/bench_replay --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <filesystem>
#include <optional>
#include <type_traits>
#include <vector>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/stores/counting_store.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/compose/alpha_tuner.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/stores/counting_store.hpp>
#include <hybridcache/sim/mooncake_trace.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/sim/synth_v1.hpp>

namespace {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;

const hc::cost_model& model() {
  static const hc::cost_model m(hc::presets::marconi_7b());
  return m;
}

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

// The engine's calls on top of prefix_cache's `expected` results (as hcbench does).
template <class Cache>
struct adapter {
  Cache& c;
  pc::match_result match(std::span<const pc::token_id> in) { return *c.match(in); }
  void commit(std::span<const pc::token_id> s, std::int64_t n, const pc::match_result& m) { (void)c.commit(s, n, &m); }
  [[nodiscard]] pc::cache_counters counters() const { return c.counters(); }
  [[nodiscard]] double alpha() const { return c.alpha(); }
  [[nodiscard]] std::int64_t used_bytes() const { return c.store().used_bytes(); }
};

template <class Admission, class MakeScorer>
void run(benchmark::State& state, const hc::sim::replay_trace& trace, std::int64_t capacity, std::int64_t kv_scale,
         MakeScorer make_scorer, std::optional<pc::tuning_config> tuning = {}) {
  using cache_type = pc::prefix_cache<hc::cost_model, Admission, decltype(make_scorer()), pc::counting_store>;
  double hit = 0;
  for (auto _ : state) {
    pc::counting_store store(capacity, model().kv_bytes_per_token() * kv_scale, model().ssm_checkpoint_bytes());
    store.allow_overflow(true);
    const pc::prefix_cache_config cfg{.admit_oversized = true};
    auto replay_with = [&](auto& cache) {
      adapter<std::remove_reference_t<decltype(cache)>> a{cache};
      hit = hc::sim::replay(a, trace, model()).token_hit_rate;  // read after the loop: not optimised away
    };
    if constexpr (pc::alpha_tunable_scorer<decltype(make_scorer())>) {
      if (tuning) {
        pc::alpha_tuned_cache<cache_type> cache(model(), std::move(store), make_scorer(), Admission{}, cfg, *tuning);
        replay_with(cache);
        continue;
      }
    }
    cache_type cache(model(), std::move(store), make_scorer(), Admission{}, cfg);
    replay_with(cache);
  }
  state.counters["token_hit_pct"] = benchmark::Counter(100.0 * hit);
  state.counters["requests"] = benchmark::Counter(static_cast<double>(trace.size()));
}

auto heapq_lru = [] { return pc::lru_scorer({.ties = pc::lru_ties::python_heapq}); };
auto node_id_lru = [] { return pc::lru_scorer{}; };
auto flop_alpha1 = [] { return pc::flop_aware_scorer(model(), {.alpha = 1.0}); };
auto flop_alpha0 = [] { return pc::flop_aware_scorer(model(), {.alpha = 0.0}); };

void chat_sglang_plus(benchmark::State& s) { run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, heapq_lru); }
void chat_sglang_plus_node_id_ties(benchmark::State& s) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, node_id_lru);
}
void chat_vllm_plus(benchmark::State& s) { run<pc::every_block_admission<32>>(s, chat_trace(), 5'000'000'000, 1, heapq_lru); }
void chat_marconi_alpha1(benchmark::State& s) { run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, flop_alpha1); }
void chat_marconi_auto(benchmark::State& s) {
  run<pc::judicious_admission>(s, chat_trace(), 5'000'000'000, 1, flop_alpha0, pc::tuning_config{.threads = 1});
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
    default: run<pc::judicious_admission>(s, *t, cap, 512, flop_alpha1); break;
  }
}

}  // namespace

BENCHMARK(chat_sglang_plus)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_sglang_plus_node_id_ties)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_vllm_plus)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_marconi_alpha1)->Unit(benchmark::kMillisecond);
BENCHMARK(chat_marconi_auto)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, sglang_plus, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, vllm_plus, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mooncake, marconi_alpha1, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
