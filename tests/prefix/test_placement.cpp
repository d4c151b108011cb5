// Issue #13, "what to build" 2: a request whose bytes fit but whose pages cannot be placed
// (the asymmetric pool's KV side cannot hold them, however much eviction frees there, while
// the SSM side is idle) is refused before anything is evicted: begin, grow and a plain
// commit leave the tree, the pins, the pool's used units and its handle tables exactly as
// they were. Before the fit check counted each side, the three of them evicted every
// evictable node and then failed with out_of_capacity.
#include <doctest/doctest.h>

#include <cstdint>
#include <ostream>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/pool_state_store.hpp"
#include "../support/random_tokens.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::memory;
using namespace hybridcache::stores;

namespace {

using hybridcache::test::random_tokens;

template <class Pool>
using placement_cache = prefix_cache<cost_model, judicious_admission, lru_scorer, pool_state_store<Pool>>;

/// Everything a refusal must leave unchanged.
struct cache_snapshot {
  std::size_t nodes = 0;
  std::int64_t tree_bytes = 0, tokens = 0, checkpoints = 0, pins = 0, evictions = 0;
  std::uint64_t kv_used = 0, ssm_used = 0, live_handles = 0;
  friend bool operator==(const cache_snapshot&, const cache_snapshot&) = default;
  friend std::ostream& operator<<(std::ostream& o, const cache_snapshot& s) {
    return o << "{nodes " << s.nodes << ", tree bytes " << s.tree_bytes << ", tokens " << s.tokens << ", checkpoints "
             << s.checkpoints << ", pins " << s.pins << ", evictions " << s.evictions << ", kv units " << s.kv_used
             << ", ssm units " << s.ssm_used << ", handles " << s.live_handles << "}";
  }
};

template <class Cache, class Pool>
cache_snapshot take_snapshot(const Cache& c, const Pool& pool) {
  cache_snapshot s;
  s.nodes = c.tree().size();
  s.tree_bytes = c.tree().bytes();
  s.tokens = c.tokens_cached();
  s.checkpoints = c.checkpoints_cached();
  for (node_id n = 1; n < c.tree().id_bound(); ++n)
    if (c.tree().live(n)) s.pins += c.tree().at(n).pins;
  s.evictions = static_cast<std::int64_t>(c.counters().evictions);
  s.kv_used = pool.stats(pool_kind::kv).used_units;
  s.ssm_used = pool.stats(pool_kind::ssm).used_units;
  s.live_handles = pool.live_handles();
  return s;
}

/// A pool of 64 chunks (16 KV, 48 SSM: 2,048 tokens of KV, 10 checkpoints of Jamba) that never rebalances, and a cache over it that holds
/// a few conversations: the KV side is mostly used, the SSM side mostly free.
struct placement_setup {
  using pool_t = simulated_vmm_pool<no_rebalancer>;
  using cache_t = placement_cache<pool_t>;
  static constexpr std::int64_t tpp = 16;
  cost_model model{presets::jamba_1_5_mini()};
  pool_t pool;
  cache_t cache;
  std::int64_t kv_side_tokens = 0;  // tokens the whole KV side holds

  placement_setup()
      : pool({.capacity_bytes = 64 * chunk_for(model), .kv_page_bytes = kv_page_bytes(model),
              .ssm_block_bytes = checkpoint_block_bytes(model), .ssm_fraction = 0.75}),
        cache(model, pool_state_store<pool_t>(pool, tpp, model.attention_layers(), model.recurrent_layers()),
              lru_scorer{}) {
    const auto kv = pool.stats(pool_kind::kv);
    kv_side_tokens = static_cast<std::int64_t>(kv.total_units) / model.attention_layers() * tpp;
    // Fill the KV side to about 80 % with four unrelated conversations.
    const std::int64_t each = kv_side_tokens / 5;
    for (std::uint32_t i = 0; i < 4; ++i) {
      const auto seq = random_tokens(static_cast<std::size_t>(each), 100 + i);
      REQUIRE(cache.commit(seq, each).has_value());
    }
    REQUIRE(cache.tree().size() >= 4);
  }
  static byte_count chunk_for(const cost_model& m) {
    const byte_count largest = std::max(kv_page_bytes(m), checkpoint_block_bytes(m));
    return (largest + default_granularity_bytes - 1) / default_granularity_bytes * default_granularity_bytes;
  }
};

}  // namespace

TEST_CASE("placement: begin of a request whose KV does not fit the KV side is refused before anything is evicted") {
  placement_setup s;
  request_lifecycle<placement_setup::cache_t> requests(s.cache);
  // More KV than the whole KV side holds, though the bytes fit: the SSM side is free.
  const std::int64_t tokens = s.kv_side_tokens + 4 * placement_setup::tpp;
  const auto prompt = random_tokens(static_cast<std::size_t>(tokens), 7);
  const auto needed = s.cache.store().kv_bytes(tokens) + 2 * s.cache.store().checkpoint_bytes();
  REQUIRE(needed <= s.cache.store().capacity_bytes());  // the bytes alone would fit
  const cache_snapshot before = take_snapshot(s.cache, s.pool);
  const auto t = requests.begin(prompt, {.output_tokens = 8});
  REQUIRE_FALSE(t.has_value());
  CHECK(t.error() == errc::out_of_capacity);
  CHECK(take_snapshot(s.cache, s.pool) == before);
  CHECK(requests.in_flight() == 0);
  // A request that fits on both sides still goes through, evicting what it needs.
  const auto small = random_tokens(static_cast<std::size_t>(s.kv_side_tokens / 2), 8);
  auto ok = requests.begin(small, {.output_tokens = 4});
  REQUIRE(ok.has_value());
  CHECK(s.cache.counters().evictions > static_cast<std::uint64_t>(before.evictions));
  CHECK(requests.abort(*ok).has_value());
}

TEST_CASE("placement: grow past what the KV side can hold is refused with the request and the cache unchanged") {
  placement_setup s;
  request_lifecycle<placement_setup::cache_t> requests(s.cache);
  const auto prompt = random_tokens(64, 9);
  auto t = requests.begin(prompt, {.output_tokens = 4});
  REQUIRE(t.has_value());
  const auto reserved = (*requests.state(*t))->reserved_tokens;
  const cache_snapshot before = take_snapshot(s.cache, s.pool);
  const auto g = requests.grow(*t, s.kv_side_tokens);
  REQUIRE_FALSE(g.has_value());
  CHECK(g.error() == errc::out_of_capacity);
  CHECK(take_snapshot(s.cache, s.pool) == before);
  CHECK((*requests.state(*t))->reserved_tokens == reserved);
  // A grow that fits after evicting still works.
  CHECK(requests.grow(*t, s.kv_side_tokens / 2).has_value());
  CHECK(s.cache.counters().evictions > static_cast<std::uint64_t>(before.evictions));
  CHECK(requests.abort(*t).has_value());
}

TEST_CASE("placement: a plain commit whose KV does not fit the KV side is refused before anything is evicted") {
  placement_setup s;
  const std::int64_t tokens = s.kv_side_tokens + 4 * placement_setup::tpp;
  const auto seq = random_tokens(static_cast<std::size_t>(tokens), 11);
  const cache_snapshot before = take_snapshot(s.cache, s.pool);
  const auto r = s.cache.commit(seq, tokens);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == errc::out_of_capacity);
  CHECK(take_snapshot(s.cache, s.pool) == before);
  // What fits on both sides is admitted, evicting.
  const auto half = random_tokens(static_cast<std::size_t>(s.kv_side_tokens / 2), 12);
  CHECK(s.cache.commit(half, static_cast<std::int64_t>(half.size())).has_value());
  CHECK(s.cache.counters().evictions > static_cast<std::uint64_t>(before.evictions));
}

TEST_CASE("placement: with a rebalancer, a side that is short moves free chunks over before evicting") {
  // The same request over a rebalancing pool: the SSM side lends free chunks to the KV
  // side first (prepare_placement), so the request is placed, evicting what it needs.
  using pool_t = simulated_vmm_pool<threshold_rebalancer>;
  const cost_model m(presets::jamba_1_5_mini());
  pool_t pool({.capacity_bytes = 64 * placement_setup::chunk_for(m), .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m), .ssm_fraction = 0.75},
              threshold_rebalancer({.threshold_low = 0.01, .threshold_high = 0.05, .migration_batch_size = 64,
                                    .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  placement_cache<pool_t> cache(m, pool_state_store<pool_t>(pool, placement_setup::tpp, m.attention_layers(),
                                                            m.recurrent_layers()),
                                lru_scorer{});
  request_lifecycle<placement_cache<pool_t>> requests(cache);
  const std::int64_t kv_side_tokens =
      static_cast<std::int64_t>(pool.stats(pool_kind::kv).total_units) / m.attention_layers() * placement_setup::tpp;
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto seq = random_tokens(static_cast<std::size_t>(kv_side_tokens / 5), 200 + i);
    REQUIRE(cache.commit(seq, static_cast<std::int64_t>(seq.size())).has_value());
  }
  const auto prompt = random_tokens(static_cast<std::size_t>(kv_side_tokens + 64), 13);
  auto t = requests.begin(prompt, {.output_tokens = 8});
  REQUIRE(t.has_value());
  CHECK(pool.counters().rebalances >= 1);
  CHECK(requests.abort(*t).has_value());
}

TEST_CASE_TEMPLATE("placement randomized: a refused begin, grow or commit never evicted anything, over pools with and without rebalancing",
                   Rebalancer, no_rebalancer, threshold_rebalancer) {
  // Random requests of every size (some more than a side holds, some fitting only after
  // evicting, some only after a migration) with up to 3 in flight: every refusal must leave
  // the snapshot as it was, and every request accepted must get all its pages (no failure
  // after evicting). Refusals and evictions must both happen.
  using pool_t = simulated_vmm_pool<Rebalancer>;
  using cache_type = placement_cache<pool_t>;
  const cost_model m(presets::jamba_1_5_mini());
  auto make_pool = [&] {
    if constexpr (std::is_same_v<Rebalancer, no_rebalancer>)
      return pool_t({.capacity_bytes = 64 * placement_setup::chunk_for(m), .kv_page_bytes = kv_page_bytes(m),
                     .ssm_block_bytes = checkpoint_block_bytes(m), .ssm_fraction = 0.75});
    else
      return pool_t({.capacity_bytes = 64 * placement_setup::chunk_for(m), .kv_page_bytes = kv_page_bytes(m),
                     .ssm_block_bytes = checkpoint_block_bytes(m), .ssm_fraction = 0.75},
                    threshold_rebalancer({.threshold_low = 0.01, .threshold_high = 0.05, .migration_batch_size = 16,
                                          .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  };
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    pool_t pool = make_pool();
    cache_type cache(m, pool_state_store<pool_t>(pool, placement_setup::tpp, m.attention_layers(), m.recurrent_layers()),
                     lru_scorer{});
    request_lifecycle<cache_type> requests(cache);
    std::mt19937 rng(seed);
    std::vector<std::vector<token_id>> done;
    std::vector<std::pair<request_ticket, std::vector<token_id>>> live;
    int refused = 0, accepted = 0;
    for (int step = 0; step < 150; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 5 || live.empty()) {  // begin
        std::vector<token_id> prompt;
        if (!done.empty() && rng() % 2 == 0) {
          const auto& base = done[rng() % done.size()];
          prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
        }
        const auto more = random_tokens(16 + rng() % (rng() % 4 == 0 ? 2600 : 600), static_cast<std::uint32_t>(rng()));
        prompt.insert(prompt.end(), more.begin(), more.end());
        const cache_snapshot before = take_snapshot(cache, pool);
        auto t = requests.begin(prompt, {.output_tokens = 8});
        if (!t) {
          REQUIRE(t.error() == errc::out_of_capacity);
          REQUIRE(take_snapshot(cache, pool) == before);
          ++refused;
        } else {
          ++accepted;
          live.emplace_back(*t, std::move(prompt));
        }
      } else if (op < 7) {  // grow
        auto& [t, prompt] = live[rng() % live.size()];
        const cache_snapshot before = take_snapshot(cache, pool);
        const auto reserved = (*requests.state(t))->reserved_tokens;
        const auto g = requests.grow(t, 1 + static_cast<std::int64_t>(rng() % (rng() % 4 == 0 ? 2500 : 200)));
        if (!g) {
          REQUIRE(g.error() == errc::out_of_capacity);
          REQUIRE(take_snapshot(cache, pool) == before);
          REQUIRE((*requests.state(t))->reserved_tokens == reserved);
          ++refused;
        }
      } else if (op < 9) {  // finish with every planned site captured
        const std::size_t i = rng() % live.size();
        auto [t, prompt] = std::move(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        const auto* s = *requests.state(t);
        auto seq = prompt;
        const auto out = random_tokens(1 + rng() % 8, static_cast<std::uint32_t>(rng()));
        seq.insert(seq.end(), out.begin(), out.end());
        std::vector<std::int64_t> captured;
        for (const auto& site : s->plan.sites) captured.push_back(site.position);
        captured.push_back(static_cast<std::int64_t>(seq.size()));
        std::sort(captured.begin(), captured.end());
        captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
        REQUIRE(requests.finish(t, seq, captured));
        done.push_back(std::move(seq));
      } else {  // a plain commit of a fresh conversation, sometimes too big for the KV side
        const auto seq = random_tokens(16 + rng() % (rng() % 3 == 0 ? 2600 : 500), static_cast<std::uint32_t>(rng()));
        const cache_snapshot before = take_snapshot(cache, pool);
        const auto r = cache.commit(seq, static_cast<std::int64_t>(seq.size()));
        if (!r) {
          REQUIRE(r.error() == errc::out_of_capacity);
          REQUIRE(take_snapshot(cache, pool) == before);
          ++refused;
        } else {
          done.push_back(seq);
        }
      }
    }
    for (auto& [t, prompt] : live) CHECK(requests.abort(t));
    CHECK(refused > 5);
    CHECK(accepted > 20);
    CHECK(cache.counters().evictions > 20);
    MESSAGE("seed " << seed << ": " << accepted << " begun, " << refused << " refused, " << cache.counters().evictions
                    << " evictions, " << pool.counters().rebalances << " rebalances");
  }
}
