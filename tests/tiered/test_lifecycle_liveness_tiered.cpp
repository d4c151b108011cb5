// Issue #31, "what to build" 1, over the tiered store: a request that an empty cache of the
// same size could hold is never refused because of what HBM holds, with the host tier
// under it (evicted nodes demote, hits load back into the staging room). The oracle is a
// fresh store, engine and cache per request (tests/support/liveness_run.hpp).
#include <doctest/doctest.h>

#include <memory>

#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"

#include "../support/liveness_run.hpp"
#include "tiered_bytes_support.hpp"

using namespace hybridcache;
using namespace hybridcache::test::tiered_bytes;

namespace {

template <class Scorer>
struct tiered_rig {
  using cache_type = prefix::prefix_cache<cost_model, prefix::judicious_admission, Scorer, store_t>;
  stores::tiered_state_store_config cfg;
  engine_t engine;
  cache_type cache;
  prefix::request_lifecycle<cache_type> requests;
  static stores::tiered_state_store_config config(std::int64_t hbm, std::int64_t host) {
    return {.capacity_bytes = hbm,
            .host_capacity_bytes = host,
            .kv_bytes_per_token = tiny().kv_bytes_per_token(),
            .checkpoint_bytes = tiny().ssm_checkpoint_bytes(),
            .staging_bytes = hbm};
  }
  static Scorer scorer() {
    if constexpr (std::is_same_v<Scorer, prefix::flop_aware_scorer>)
      return prefix::flop_aware_scorer(tiny(), {.alpha = 1.0});
    else
      return Scorer{};
  }
  tiered_rig(std::int64_t hbm, std::int64_t host)
      : cfg(config(hbm, host)),
        engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg), {.measure_bandwidth = false}),
        cache(tiny(), store_t(cfg, engine), scorer()),
        requests(cache) {}
};

}  // namespace

TEST_CASE_TEMPLATE("liveness: a request an empty cache of this size could hold is admitted (tiered store, host tier)",
                   Scorer, prefix::lru_scorer, prefix::flop_aware_scorer) {
  const std::int64_t kv = tiny().kv_bytes_per_token();
  int host_loads = 0;
  for (const std::int64_t tokens : {160, 240, 400}) {
    for (const int in_flight : {1, 3}) {
      for (std::uint32_t seed = 1; seed <= 2; ++seed) {
        CAPTURE(tokens);
        CAPTURE(in_flight);
        CAPTURE(seed);
        const std::int64_t hbm = tokens * kv;
        const auto c = test::liveness::random_run(seed * 31u + static_cast<std::uint32_t>(tokens), in_flight,
                                                  [&] { return std::make_unique<tiered_rig<Scorer>>(hbm, 4 * hbm); });
        CHECK(c.admitted > 0);
        host_loads += c.host_loads;
      }
    }
  }
  CHECK(host_loads > 0);
}
