// Memory pools: allocate + free of one KV page / one SSM block (the hot path), a
// rebalance of 128 units, the baselines for comparison, and one whole allocator replay.
// A global operator new counter proves the hot path does not touch the heap
// (counter "heap_allocs_per_pair" must be 0).
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/memory/asymmetric_pool.hpp>
#include <hybridcache/memory/fixed_dual_pool.hpp>
#include <hybridcache/memory/padded_unified_pool.hpp>
#include <hybridcache/sim/alloc_replay.hpp>

namespace {
std::atomic<std::uint64_t> heap_allocs{0};
}

// Replacing the global new/delete pair with malloc/free is valid; g++ 12 cannot see the pair.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  heap_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace hybridcache;
using namespace hybridcache::memory;

namespace {

constexpr byte_count GiB = byte_count{1} << 30;

asymmetric_pool_config jamba_config(byte_count budget = GiB) {
  const cost_model m(presets::jamba_1_5_mini());
  return {.capacity_bytes = budget, .kv_page_bytes = kv_page_bytes(m), .ssm_block_bytes = ssm_block_bytes(m)};
}

// Half-full pool, then time allocate + free pairs of `kind`.
template <class Pool>
void alloc_free_pair(benchmark::State& state, Pool& pool, pool_kind kind) {
  std::vector<packed_handle> held;
  for (std::int64_t i = 0; i < pool.stats(kind).total_units / 2; ++i) held.push_back(pool.allocate(kind).value());
  const std::uint64_t before = heap_allocs.load();
  for (auto _ : state) {
    auto h = pool.allocate(kind);
    benchmark::DoNotOptimize(h);
    auto r = pool.free(*h);
    benchmark::DoNotOptimize(r);
  }
  state.counters["heap_allocs_per_pair"] = benchmark::Counter(
      static_cast<double>(heap_allocs.load() - before) / static_cast<double>(state.iterations()));
  for (auto h : held) (void)pool.free(h);
}

void bm_asymmetric_kv_pair(benchmark::State& state) {
  simulated_vmm_pool<threshold_rebalancer> pool(jamba_config());
  alloc_free_pair(state, pool, pool_kind::kv);
}
BENCHMARK(bm_asymmetric_kv_pair);

void bm_asymmetric_ssm_pair(benchmark::State& state) {
  simulated_vmm_pool<threshold_rebalancer> pool(jamba_config());
  alloc_free_pair(state, pool, pool_kind::ssm);
}
BENCHMARK(bm_asymmetric_ssm_pair);

void bm_asymmetric_host_kv_pair(benchmark::State& state) {
  host_asymmetric_pool<threshold_rebalancer> pool(jamba_config(256u << 20));
  alloc_free_pair(state, pool, pool_kind::kv);
}
BENCHMARK(bm_asymmetric_host_kv_pair);

void bm_fixed_dual_kv_pair(benchmark::State& state) {
  const cost_model m(presets::jamba_1_5_mini());
  fixed_dual_pool<> pool({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(m), .ssm_block_bytes = ssm_block_bytes(m),
                          .ssm_ratio = 0.5});
  alloc_free_pair(state, pool, pool_kind::kv);
}
BENCHMARK(bm_fixed_dual_kv_pair);

void bm_padded_unified_kv_pair(benchmark::State& state) {
  const cost_model m(presets::jamba_1_5_mini());
  padded_unified_pool<> pool({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(m),
                              .ssm_block_bytes = ssm_block_bytes(m)});
  alloc_free_pair(state, pool, pool_kind::kv);
}
BENCHMARK(bm_padded_unified_kv_pair);

// One rebalance of 128 KV pages' worth (4 chunks of 2 MiB) and back again; the time
// reported is per rebalance. Both pools hold live units, so the chunk choice is real.
template <class Pool>
void rebalance_128(benchmark::State& state, Pool& pool) {
  std::vector<packed_handle> held;
  for (int i = 0; i < 2000; ++i) held.push_back(pool.allocate_kv().value());
  for (int i = 0; i < 500; ++i) held.push_back(pool.allocate_ssm().value());
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool.rebalance(pool_kind::ssm, 128));
    benchmark::DoNotOptimize(pool.rebalance(pool_kind::kv, 32));  // 32 SSM blocks = 4 chunks back
  }
  state.SetItemsProcessed(state.iterations() * 2);  // items = rebalances
  for (auto h : held) (void)pool.free(h);
}

void bm_rebalance_128_counting(benchmark::State& state) {
  simulated_vmm_pool<threshold_rebalancer> pool(jamba_config());
  rebalance_128(state, pool);
}
BENCHMARK(bm_rebalance_128_counting);

void bm_rebalance_128_host(benchmark::State& state) {
  host_asymmetric_pool<threshold_rebalancer> pool(jamba_config());
  rebalance_128(state, pool);
}
BENCHMARK(bm_rebalance_128_host);

// Rebalance that must compact first: every donor chunk holds one live page.
void bm_rebalance_128_compacting_host(benchmark::State& state) {
  auto cfg = jamba_config(256u << 20);
  cfg.compaction = true;
  host_asymmetric_pool<threshold_rebalancer> pool(cfg);
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<packed_handle> all, keep;
    for (;;) {
      auto h = pool.allocate_kv();
      if (!h) break;
      all.push_back(*h);
    }
    for (std::size_t i = 0; i < all.size(); ++i)
      if (i % 8 == 0) keep.push_back(all[i]);
      else (void)pool.free(all[i]);
    state.ResumeTiming();
    benchmark::DoNotOptimize(pool.rebalance(pool_kind::ssm, 128));
    state.PauseTiming();
    for (auto h : keep) (void)pool.free(h);
    pool.rebalance(pool_kind::kv, 32);
    state.ResumeTiming();
  }
}
BENCHMARK(bm_rebalance_128_compacting_host)->Unit(benchmark::kMicrosecond);

// One whole replay cell (the sweep runs 288 of these).
void bm_replay_cell(benchmark::State& state) {
  const auto w = sim::bundled_alloc_workload("mixed_long", 2);
  const auto v = static_cast<sim::alloc_variant>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(sim::replay_alloc(w, presets::jamba_1_5_mini(), v));
  state.SetLabel(std::string(sim::to_string(v)));
}
BENCHMARK(bm_replay_cell)->DenseRange(0, 5)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
