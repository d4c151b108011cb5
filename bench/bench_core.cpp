// Core primitives: the cost model's FLOP arithmetic and the generation table, which sit on
// the hot paths of eviction scoring and allocation.
#include <benchmark/benchmark.h>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/core/handle.hpp>
#include <hybridcache/model/presets.hpp>

using namespace hybridcache;

static void bm_saved_flops(benchmark::State& state) {
  const cost_model m(presets::marconi_7b());
  std::int64_t p = 1000, L = 4000;
  for (auto _ : state) {
    benchmark::DoNotOptimize(m.node_flop_efficiency(p, L));
    benchmark::DoNotOptimize(p);
    benchmark::DoNotOptimize(L);
  }
}
BENCHMARK(bm_saved_flops);

static void bm_generation_table_acquire_release(benchmark::State& state) {
  generation_table t(1, 1 << 16);
  for (auto _ : state) {
    auto h = t.acquire();
    benchmark::DoNotOptimize(h);
    (void)t.release(*h);
  }
}
BENCHMARK(bm_generation_table_acquire_release);

BENCHMARK_MAIN();
