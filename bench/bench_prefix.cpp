// Prefix cache hot paths: match of a fully cached 32k-token prefix (against a plain memcmp
// over the same tokens), commit of a 1k-token extension, and eviction with 100k cached nodes
// (threshold walk vs the naive O(n) rescan the reference does), and the request lifecycle
// (begin + finish) at 10k cached nodes with its allocations per request. Results:
// docs/results/prefix-cache.md, docs/runtime.md.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <algorithm>
#include <random>
#include <type_traits>
#include <vector>

#include <hybridcache/compose/adaptive_scorer.hpp>
#include <hybridcache/model/presets.hpp>
#include <hybridcache/prefix/flop_aware_scorer.hpp>
#include <hybridcache/prefix/gdsf_scorer.hpp>
#include <hybridcache/prefix/switching_scorer.hpp>
#include <hybridcache/prefix/lifecycle.hpp>
#include <hybridcache/prefix/prefix_cache.hpp>
#include "hybridcache/stores/counting_store.hpp"
#include <hybridcache/sim/reference/reference_scorer.hpp>

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;

// Heap allocations counted while armed (bm_lifecycle_10k_nodes). GCC flags the replaced
// pair as mismatched when it inlines them (a false positive: both sides are malloc/free).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
static std::atomic<std::int64_t> g_allocations{0};
static std::atomic<bool> g_count_allocations{false};
void* operator new(std::size_t n) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

std::vector<token_id> random_tokens(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<token_id> v(n);
  for (auto& t : v) t = static_cast<token_id>(3 + rng() % 31997);
  return v;
}

const cost_model& model() {
  static const cost_model m(presets::marconi_7b());
  return m;
}

counting_store big_store(std::int64_t ckpts, std::int64_t tokens) {
  const auto& m = model();
  return counting_store(ckpts * m.ssm_checkpoint_bytes() + tokens * m.kv_bytes_per_token(), m.kv_bytes_per_token(),
                        m.ssm_checkpoint_bytes());
}

constexpr std::int64_t k32 = 32768;

template <class S>
S make_scorer();
template <>
lru_scorer make_scorer<lru_scorer>() {
  return lru_scorer{};
}
template <>
flop_aware_scorer make_scorer<flop_aware_scorer>() {
  return flop_aware_scorer(model(), {.alpha = 1.0});
}
template <>
sim::reference_flop_scorer make_scorer<sim::reference_flop_scorer>() {
  return sim::reference_flop_scorer(model(), {.alpha = 1.0});
}
template <>
gdsf_scorer make_scorer<gdsf_scorer>() {
  return gdsf_scorer(model());
}

}  // namespace

// memcmp of 32k tokens (the floor a match cannot beat).
static void bm_memcmp_32k(benchmark::State& state) {
  const auto a = random_tokens(k32, 1);
  const auto b = a;
  for (auto _ : state) {
    benchmark::DoNotOptimize(std::memcmp(a.data(), b.data(), a.size() * sizeof(token_id)));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * k32);
}
BENCHMARK(bm_memcmp_32k);

// match + release of a fully cached 32k-token prefix. Arg 0: one node (judicious);
// arg 1: a checkpoint every 32 tokens (1024 nodes on the path, vLLM+-style).
template <class Admission>
static void bm_match_32k(benchmark::State& state) {
  const auto seq = random_tokens(k32, 1);
  prefix_cache<cost_model, Admission, lru_scorer, counting_store> c(model(), big_store(2048, 2 * k32), lru_scorer{});
  if (!c.commit(seq, k32)) state.SkipWithError("commit failed");
  const auto query = seq;  // a different buffer, like a new request's tokens
  for (auto _ : state) {
    auto m = c.match(query);
    benchmark::DoNotOptimize(m);
    (void)c.release(*m);
  }
  state.SetItemsProcessed(state.iterations() * k32);
  state.counters["nodes_on_path"] = static_cast<double>(c.tree().size());
}
BENCHMARK(bm_match_32k<judicious_admission>)->Name("bm_match_32k/one_node");
BENCHMARK(bm_match_32k<every_block_admission<32>>)->Name("bm_match_32k/every_32_tokens");

// match + commit of a 1k-token extension of a cached 4k prefix, steady state: the store
// holds about 64 extensions, so each commit also evicts the least recently used one.
template <class Scorer>
static void bm_commit_1k_extension(benchmark::State& state) {
  const auto base = random_tokens(4096, 2);
  prefix_cache<cost_model, judicious_admission, Scorer, counting_store> c(model(), big_store(70, 4096 + 64 * 1024), make_scorer<Scorer>());
  if (!c.commit(base, 4096)) state.SkipWithError("commit failed");
  std::vector<token_id> seq = base;
  seq.resize(4096 + 1024);
  std::mt19937_64 rng(3);
  std::int64_t evictions = 0;
  for (auto _ : state) {
    for (std::size_t i = 4096; i < seq.size(); ++i) seq[i] = static_cast<token_id>(3 + rng() % 31997);
    auto m = c.match(std::span<const token_id>(seq).first(4096 + 512));
    auto r = c.commit(seq, 4096 + 512, &*m);
    evictions += r->evictions;
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * 1024);
  state.counters["evictions_per_commit"] =
      benchmark::Counter(static_cast<double>(evictions) / static_cast<double>(state.iterations()));
}
BENCHMARK(bm_commit_1k_extension<lru_scorer>)->Name("bm_commit_1k_extension/lru");
BENCHMARK(bm_commit_1k_extension<flop_aware_scorer>)->Name("bm_commit_1k_extension/flop_aware_a1");

// Eviction with ~100k cached nodes: 1000 shared 16-token prefixes x 100 8-token leaves
// (101k nodes). Each iteration commits a new 8-token leaf, which evicts exactly one node.
template <class Scorer>
static void bm_evict_100k(benchmark::State& state) {
  constexpr int prefixes = 1000, leaves = 100;
  const std::int64_t nodes = prefixes * (leaves + 1);
  prefix_cache<cost_model, judicious_admission, Scorer, counting_store> c(model(), big_store(nodes, prefixes * (16 + leaves * 8)),
                                                          make_scorer<Scorer>());
  std::mt19937_64 rng(4);
  std::vector<std::vector<token_id>> roots;
  for (int p = 0; p < prefixes; ++p) {
    auto r = random_tokens(16, 100 + static_cast<std::uint64_t>(p));
    r[0] = static_cast<token_id>(p + 1);
    roots.push_back(r);
  }
  // Round-robin over prefixes: the second leaf of a prefix splits it into a branch node.
  for (int l = 0; l < leaves; ++l) {
    for (int p = 0; p < prefixes; ++p) {
      auto s = roots[static_cast<std::size_t>(p)];
      for (int k = 0; k < 8; ++k) s.push_back(static_cast<token_id>(40000 + l * 8 + k));
      if (!c.commit(s, 16)) state.SkipWithError("fill failed");
    }
  }
  std::int64_t evictions = 0;
  int next = 0;
  std::uint64_t scored_before = 0;
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>) scored_before = c.scorer().nodes_scored();
  for (auto _ : state) {
    auto s = roots[static_cast<std::size_t>(rng() % prefixes)];
    for (int k = 0; k < 8; ++k) s.push_back(static_cast<token_id>(100000 + next * 8 + k));
    ++next;
    auto r = c.commit(s, 16);
    evictions += r->evictions;
  }
  state.counters["nodes"] = static_cast<double>(c.tree().size());
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>) {
    // Nodes the threshold walk scored per eviction (the naive rescan scores all ~101k).
    state.counters["scored_per_eviction"] = static_cast<double>(c.scorer().nodes_scored() - scored_before) /
                                            static_cast<double>(std::max<std::int64_t>(1, evictions));
  }
  state.counters["evictions_per_commit"] =
      benchmark::Counter(static_cast<double>(evictions) / static_cast<double>(state.iterations()));
}
BENCHMARK(bm_evict_100k<lru_scorer>)->Name("bm_evict_100k/lru")->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_evict_100k<flop_aware_scorer>)->Name("bm_evict_100k/flop_aware_a1")->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_evict_100k<sim::reference_flop_scorer>)
    ->Name("bm_evict_100k/naive_reference_a1")
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(100);

// The adversarial case of the threshold walk (issue #14): recency and efficiency
// anti-correlated. 100k leaves under the root: the older half 50 tokens each (more FLOPs per
// byte), the newer half 10 tokens each. Each iteration commits one more 10-token leaf, which
// evicts one node. The threshold walk must score nearly every node before its bound passes
// the best; GDSF takes its minimum in O(1); LRU its oldest leaf.
template <class Scorer>
static void bm_evict_adversarial_100k(benchmark::State& state) {
  constexpr int half = 50'000;
  prefix_cache<cost_model, judicious_admission, Scorer, counting_store> c(model(), big_store(2 * half, half * 50 + half * 10),
                                                          make_scorer<Scorer>());
  int next = 1;
  auto leaf = [&](int tokens) {
    std::vector<token_id> s(static_cast<std::size_t>(tokens));
    for (int k = 0; k < tokens; ++k) s[static_cast<std::size_t>(k)] = static_cast<token_id>(next * 64 + k);
    ++next;
    return s;
  };
  for (int i = 0; i < half; ++i)
    if (!c.commit(leaf(50), 50)) state.SkipWithError("fill failed");
  for (int i = 0; i < half; ++i)
    if (!c.commit(leaf(10), 10)) state.SkipWithError("fill failed");
  std::int64_t evictions = 0;
  std::uint64_t scored_before = 0;
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>) scored_before = c.scorer().nodes_scored();
  for (auto _ : state) {
    auto r = c.commit(leaf(10), 10);
    evictions += r->evictions;
  }
  state.counters["nodes"] = static_cast<double>(c.tree().size());
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>)
    state.counters["scored_per_eviction"] = static_cast<double>(c.scorer().nodes_scored() - scored_before) /
                                            static_cast<double>(std::max<std::int64_t>(1, evictions));
  state.counters["evictions_per_commit"] =
      benchmark::Counter(static_cast<double>(evictions) / static_cast<double>(state.iterations()));
}
BENCHMARK(bm_evict_adversarial_100k<lru_scorer>)->Name("bm_evict_adversarial_100k/lru")->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_evict_adversarial_100k<flop_aware_scorer>)  // the default index: the bounded walk
    ->Name("bm_evict_adversarial_100k/flop_aware_a1")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_evict_adversarial_100k<gdsf_scorer>)->Name("bm_evict_adversarial_100k/gdsf")->Unit(benchmark::kMicrosecond);
namespace {
struct flop_classes_scorer : flop_aware_scorer {  // the same scorer, efficiency-class index
  flop_classes_scorer() : flop_aware_scorer(::model(), {.alpha = 1.0, .index = flop_index::efficiency_classes}) {}
};
template <>
flop_classes_scorer make_scorer<flop_classes_scorer>() {
  return flop_classes_scorer{};
}
}  // namespace
BENCHMARK(bm_evict_adversarial_100k<flop_classes_scorer>)
    ->Name("bm_evict_adversarial_100k/flop_aware_a1_classes")
    ->Unit(benchmark::kMicrosecond);
namespace {
struct flop_threshold_scorer : flop_aware_scorer {  // the exact walk, unbounded (O(n) here)
  flop_threshold_scorer() : flop_aware_scorer(::model(), {.alpha = 1.0, .index = flop_index::threshold_walk}) {}
};
template <>
flop_threshold_scorer make_scorer<flop_threshold_scorer>() {
  return flop_threshold_scorer{};
}
struct switching_flop_scorer : lru_flop_gdsf_scorer {  // the adaptive selector's live index, following FLOP-aware a1
  switching_flop_scorer()
      : lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(::model(), {.alpha = 1.0}), gdsf_scorer(::model()), 1) {}
};
template <>
switching_flop_scorer make_scorer<switching_flop_scorer>() {
  return switching_flop_scorer{};
}
}  // namespace
BENCHMARK(bm_evict_adversarial_100k<flop_threshold_scorer>)
    ->Name("bm_evict_adversarial_100k/flop_aware_a1_threshold")
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);
BENCHMARK(bm_evict_adversarial_100k<switching_flop_scorer>)
    ->Name("bm_evict_adversarial_100k/switching_flop_a1")
    ->Unit(benchmark::kMicrosecond);

// The request lifecycle at 10k cached nodes: begin (match, plan, reserve) + finish (adopt)
// of a 32-token continuation of a cached conversation with 16 decode tokens, steady state
// (the store holds about 10k nodes, so requests also evict). Counts heap allocations per
// request (operator new is replaced in this executable; only the timed loop is counted).
template <class Scorer>
static void bm_lifecycle_10k_nodes(benchmark::State& state) {
  using cache_t = prefix_cache<cost_model, judicious_admission, Scorer, counting_store>;
  // Room for about 10k nodes (each holds a checkpoint and ~50 tokens of KV).
  cache_t c(model(), big_store(10'500, 10'500 * 60), make_scorer<Scorer>());
  request_lifecycle<cache_t> requests(c);
  std::mt19937_64 rng(11);
  std::vector<std::vector<token_id>> convs;
  for (int s = 0; s < 16; ++s) convs.push_back(random_tokens(256, 100 + static_cast<std::uint64_t>(s)));
  std::vector<token_id> prompt, seq;
  prompt.reserve(1 << 16);
  seq.reserve(1 << 16);
  const std::vector<std::int64_t> captured_storage(1, 0);
  auto one = [&] {
    auto& base = convs[rng() % convs.size()];
    prompt.assign(base.begin(), base.end());
    for (int i = 0; i < 32; ++i) prompt.push_back(static_cast<token_id>(3 + rng() % 31997));
    auto t = requests.begin(prompt, {.output_tokens = 16});
    if (!t) return false;
    seq.assign(prompt.begin(), prompt.end());
    for (int i = 0; i < 16; ++i) seq.push_back(static_cast<token_id>(3 + rng() % 31997));
    const std::int64_t end = static_cast<std::int64_t>(seq.size());
    const std::span<const std::int64_t> captured(&end, 1);
    if (!requests.finish(*t, seq, captured)) return false;
    if (base.size() < 2000) base.assign(seq.begin(), seq.end());  // the conversation goes on
    else base.resize(256);                                         // or a new one starts
    return true;
  };
  for (int i = 0; i < 100'000 && c.tree().size() < 10'000; ++i)
    if (!one()) break;
  for (int i = 0; i < 2000; ++i) (void)one();  // warm: vectors and tables at their steady size
  g_allocations.store(0);
  g_count_allocations.store(true);
  std::int64_t refused = 0;
  for (auto _ : state)
    if (!one()) ++refused;
  g_count_allocations.store(false);
  state.counters["allocations_per_request"] =
      benchmark::Counter(static_cast<double>(g_allocations.load()) / static_cast<double>(state.iterations()));
  state.counters["nodes"] = benchmark::Counter(static_cast<double>(c.tree().size()));
  state.counters["refused"] = benchmark::Counter(static_cast<double>(refused));
}
BENCHMARK(bm_lifecycle_10k_nodes<lru_scorer>)->Name("bm_lifecycle_10k_nodes/lru");
BENCHMARK(bm_lifecycle_10k_nodes<flop_aware_scorer>)->Name("bm_lifecycle_10k_nodes/flop_aware_a1");
// The adaptive selector (--alpha auto) per request: exact shadows (rate 1, the default), and
// sampled ones at rate 0.1 from the first request (issue #36 item 4). This stream has 16
// conversations (each slot's first 256 tokens stay), so a 0.1 sample holds one or two.
namespace {
struct adaptive_exact : compose::marconi_adaptive_scorer {
  adaptive_exact() : compose::marconi_adaptive_scorer(compose::make_marconi_adaptive_scorer(::model())) {}
};
struct adaptive_sampled : compose::marconi_adaptive_scorer {
  adaptive_sampled()
      : compose::marconi_adaptive_scorer(compose::make_marconi_adaptive_scorer(::model(), {.sampling = {.rate = 0.1}})) {}
};
template <>
adaptive_exact make_scorer<adaptive_exact>() {
  return adaptive_exact{};
}
template <>
adaptive_sampled make_scorer<adaptive_sampled>() {
  return adaptive_sampled{};
}
}  // namespace
BENCHMARK(bm_lifecycle_10k_nodes<adaptive_exact>)->Name("bm_lifecycle_10k_nodes/adaptive_exact");
BENCHMARK(bm_lifecycle_10k_nodes<adaptive_sampled>)->Name("bm_lifecycle_10k_nodes/adaptive_sampled_r0.1");
// The live switching scorer alone (following FLOP-aware a1, no shadows), each index upkeep.
namespace {
struct switching_eager : lru_flop_gdsf_scorer {
  switching_eager()
      : lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(::model(), {.alpha = 1.0}), gdsf_scorer(::model()), 1,
                             index_upkeep::every_part) {}
};
template <>
switching_eager make_scorer<switching_eager>() {
  return switching_eager{};
}
}  // namespace
BENCHMARK(bm_lifecycle_10k_nodes<switching_flop_scorer>)->Name("bm_lifecycle_10k_nodes/switching_flop_a1");
BENCHMARK(bm_lifecycle_10k_nodes<switching_eager>)->Name("bm_lifecycle_10k_nodes/switching_flop_a1_every_part");

BENCHMARK_MAIN();
