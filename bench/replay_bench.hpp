// bench/replay_bench.hpp: the replay loop the benchmarks time (bench_replay.cpp,
// bench_tokenizer.cpp): a fresh prefix_cache over a counting store per iteration, replayed
// through the adapter hcbench uses (sim/prefix_cache_replay.hpp: match, commit after decode).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>
#include <utility>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/compose/alpha_tuner.hpp>
#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/admission.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/lru_scorer.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include <hybridcache/prefix/switching_scorer.hpp>
#include <hybridcache/sim/prefix_cache_replay.hpp>
#include <hybridcache/sim/replay.hpp>
#include <hybridcache/stores/counting_store.hpp>

namespace replay_bench {

namespace hc = hybridcache;
namespace pc = hybridcache::prefix;

/// Marconi's 7B hybrid (the model every replay in docs/replay.md uses by default).
inline const hc::cost_model& model() {
  static const hc::cost_model m(hc::presets::marconi_7b());
  return m;
}

/// Times one whole replay of `trace` per iteration at `capacity` bytes (`kv_scale` tokens per
/// id); `tuning` wraps the cache in Marconi's online alpha tuner (--alpha auto). Reports the
/// token hit rate and the request count as counters, and for the adaptive selector its
/// shadows' heap bytes against the live cache's metadata (`prefix_cache::memory_bytes`) at the
/// end: shadow_mem_pct, shadow_kB, live_meta_kB.
template <class Admission, class MakeScorer>
void run(benchmark::State& state, const hc::sim::replay_trace& trace, std::int64_t capacity, std::int64_t kv_scale,
         MakeScorer make_scorer, std::optional<hc::compose::tuning_config> tuning = {}) {
  using cache_type = pc::prefix_cache<hc::cost_model, Admission, decltype(make_scorer()), hc::stores::counting_store>;
  double hit = 0;
  double shadow_mem = -1;  // the adaptive selector's shadows' bytes / the live cache's metadata, at the end
  double shadow_bytes = 0, live_bytes = 0;
  for (auto _ : state) {
    hc::stores::counting_store store = hc::sim::replay_store(model(), {.capacity_bytes = capacity, .tokens_per_id = kv_scale});
    const pc::prefix_cache_config cfg{.admit_oversized = true};
    auto replay_with = [&](auto& cache) {
      hit = hc::sim::replay_prefix_cache(cache, trace, model()).token_hit_rate;  // read after the loop: not optimised away
    };
    if constexpr (hc::compose::alpha_tunable_scorer<decltype(make_scorer())>) {
      if (tuning) {
        hc::compose::alpha_tuned_cache<cache_type> cache(model(), std::move(store), make_scorer(), Admission{}, cfg, *tuning);
        replay_with(cache);
        continue;
      }
    }
    cache_type cache(model(), std::move(store), make_scorer(), Admission{}, cfg);
    replay_with(cache);
    if constexpr (requires { cache.scorer().overhead().shadow_bytes; }) {
      // The live cache's metadata counted as a shadow's is (prefix_cache::memory_bytes: the tree
      // with its token buffers, the live switching scorer's indexes and stamps, scratch).
      live_bytes = static_cast<double>(cache.memory_bytes());
      shadow_bytes = static_cast<double>(cache.scorer().overhead().shadow_bytes);
      shadow_mem = shadow_bytes / live_bytes;
    }
  }
  if (shadow_mem >= 0) {
    state.counters["shadow_mem_pct"] = benchmark::Counter(100.0 * shadow_mem);
    state.counters["shadow_kB"] = benchmark::Counter(shadow_bytes / 1e3);
    state.counters["live_meta_kB"] = benchmark::Counter(live_bytes / 1e3);
  }
  state.counters["token_hit_pct"] = benchmark::Counter(100.0 * hit);
  state.counters["requests"] = benchmark::Counter(static_cast<double>(trace.size()));
}

/// The scorers of the policies hcbench names: sglang+/vllm+ (LRU, CPython heapq ties),
/// marconi (FLOP-aware; alpha 0 is where --alpha auto starts tuning).
inline auto heapq_lru = [] { return pc::lru_scorer({.ties = pc::lru_ties::python_heapq}); };
inline auto node_id_lru = [] { return pc::lru_scorer{}; };
inline auto flop_alpha1 = [] { return pc::flop_aware_scorer(model(), {.alpha = 1.0}); };
inline auto flop_alpha0 = [] { return pc::flop_aware_scorer(model(), {.alpha = 0.0}); };
/// What `hcbench --policy marconi` (--alpha auto) runs: the adaptive selector's default candidates.
inline auto marconi_selector = [] { return hc::compose::make_marconi_adaptive_scorer(model()); };
/// The selector's live half alone (no shadows): the switching scorer over LRU, FLOP-aware a1
/// and GDSF following FLOP-aware a1, with `upkeep` (issue #36: what the live cache costs).
inline auto switching_live(pc::index_upkeep upkeep) {
  return [=] {
    return pc::lru_flop_gdsf_scorer(pc::lru_scorer{}, pc::flop_aware_scorer(model(), {.alpha = 1.0}), pc::gdsf_scorer(model()), 1,
                                    upkeep);
  };
}
/// The selector with sampled shadows (issue #36): `sampling` as given, `tokens_per_id` the trace's;
/// `upkeep` of the live switching scorer (every_part: every rule's index current on every hook,
/// as before issue #36's lazy upkeep).
inline auto sampled_selector(hc::compose::shadow_sampling_config sampling, std::int64_t tokens_per_id,
                             pc::index_upkeep upkeep = pc::index_upkeep::followed) {
  return [=] {
    return hc::compose::marconi_adaptive_scorer(
        model(),
        pc::lru_flop_gdsf_scorer(pc::lru_scorer{}, pc::flop_aware_scorer(model()), pc::gdsf_scorer(model()), 0, upkeep),
        {.tokens_per_id = tokens_per_id, .sampling = sampling});
  };
}

}  // namespace replay_bench
