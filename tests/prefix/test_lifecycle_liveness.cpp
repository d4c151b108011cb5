// Issue #31, "what to build" 1: liveness. A request that an empty cache of the same size
// could hold is never refused because of what the cache holds: `begin` falls back to a
// shorter reuse (down to none) and may evict the path it would have pinned when no other
// request holds it. The oracle is literal: for every request, a fresh pool, store and cache
// of the same configuration are built and asked the same `begin`; whenever the oracle
// admits the request, the real cache must admit it at once if nothing is in flight, and
// after the requests in flight end otherwise. A request the oracle refuses must be refused
// by the real cache too, with the message that says it can never fit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "../support/liveness_run.hpp"
#include "../support/random_tokens.hpp"
#include "../support/tiny_hybrid_model.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::memory;
using namespace hybridcache::stores;

namespace {

constexpr std::int64_t tpp = 16;
using pool_t = host_asymmetric_pool<threshold_rebalancer>;
using store_t = pool_state_store<pool_t>;

template <class Scorer>
Scorer make_scorer(const cost_model& m) {
  if constexpr (std::is_same_v<Scorer, flop_aware_scorer>)
    return flop_aware_scorer(m, {.alpha = 1.0});
  else
    return Scorer{};
}

/// A pool, its store, a cache and its lifecycle, built the same way for the real run and
/// for every oracle (test::liveness::random_run).
template <class Scorer>
struct rig {
  using cache_type = prefix_cache<cost_model, judicious_admission, Scorer, store_t>;
  pool_t pool;
  cache_type cache;
  request_lifecycle<cache_type> requests;
  rig(const cost_model& m, byte_count budget, std::int64_t host_pages)
      : pool({.capacity_bytes = budget, .kv_page_bytes = kv_page_bytes(m, tpp),
              .ssm_block_bytes = checkpoint_block_bytes(m), .granularity_bytes = 32 << 10},
             threshold_rebalancer({.threshold_low = 0.02, .threshold_high = 0.10, .migration_batch_size = 8,
                                   .min_rebalance_interval_ops = 0, .size_to_demand = true})),
        cache(m,
              store_t(pool, tpp, m.attention_layers(), m.recurrent_layers(),
                      host_tier_config{.kv_pages = host_pages, .checkpoint_blocks = host_pages / 4}),
              make_scorer<Scorer>(m)),
        requests(cache) {}
};

}  // namespace

/// Runs the liveness property over pool sizes, 1 and 3 requests in flight and 3 seeds;
/// returns the host loads seen.
template <class Scorer>
int sweep(std::initializer_list<std::uint64_t> kibs, std::int64_t host_pages, std::uint32_t salt) {
  const cost_model m(test::tiny_gdn_spec("liveness_test"));
  int host_loads = 0;
  for (const std::uint64_t kib : kibs)
    for (const int in_flight : {1, 3})
      for (std::uint32_t seed = 1; seed <= 3; ++seed) {
        CAPTURE(kib);
        CAPTURE(in_flight);
        CAPTURE(seed);
        const auto c = test::liveness::random_run(seed * salt + static_cast<std::uint32_t>(kib), in_flight,
                                                  [&] { return std::make_unique<rig<Scorer>>(m, kib << 10, host_pages); });
        CHECK(c.admitted > 0);
        MESSAGE("admitted " << c.admitted << ", never fits " << c.refused_never << ", waited " << c.waited);
        host_loads += c.host_loads;
      }
  return host_loads;
}

TEST_CASE_TEMPLATE("liveness: a request an empty cache of this size could hold is admitted (pool store, no host tier)",
                   Scorer, lru_scorer, flop_aware_scorer) {
  CHECK(sweep<Scorer>({192u, 256u, 384u}, 0, 7919u) == 0);
}

TEST_CASE_TEMPLATE("liveness: the same with the pool store's host tier", Scorer, lru_scorer, flop_aware_scorer) {
  CHECK(sweep<Scorer>({192u, 256u}, 64, 104729u) > 0);
}
