// Randomized differential test: asymmetric_pool (host memory, compaction, live rebalancer)
// against a naive model of what must hold after every operation: per-pool used counts,
// chunk conservation (capacity only moves, never appears or vanishes), all-or-nothing bulk
// allocation, no failure while free units exist, bad frees rejected without effect, and
// the bytes of every live unit intact (catches overlapping units and bad compaction copies).
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <hybridcache/memory/asymmetric_pool.hpp>

using namespace hybridcache;
using namespace hybridcache::memory;

namespace {

struct naive_model {
  struct live_unit {
    pool_kind kind;
    std::uint8_t pattern;
  };
  std::map<std::uint64_t, live_unit> live;  // handle bits -> unit
  std::vector<packed_handle> dead;          // freed handles (every free of one must fail)
  std::int64_t used[2] = {0, 0};
};

template <class Pool>
void check_unit(const Pool& pool, packed_handle h, const naive_model::live_unit& u, bool all_bytes) {
  std::byte* p = pool.resolve(h).value();
  const byte_count n = pool.stats(u.kind).unit_bytes;
  const auto want = static_cast<std::byte>(u.pattern);
  REQUIRE(p[0] == want);
  REQUIRE(p[n - 1] == want);
  if (all_bytes) {
    bool intact = true;
    for (byte_count i = 0; i < n; ++i) intact &= p[i] == want;
    REQUIRE(intact);
  }
}

void run_differential(asymmetric_pool_config cfg, rebalancer_config rc, std::uint64_t seed, int ops) {
  host_asymmetric_pool<threshold_rebalancer> pool(cfg, threshold_rebalancer(rc));
  host_asymmetric_pool<threshold_rebalancer> other(cfg, threshold_rebalancer(rc));
  const auto foreign = other.allocate_kv().value();
  naive_model m;
  std::mt19937_64 rng(seed);
  const std::uint32_t total_chunks = pool.chunks();
  const std::uint32_t upc[2] = {pool.region(pool_kind::kv).units_per_chunk(),
                                pool.region(pool_kind::ssm).units_per_chunk()};
  auto chunks_of = [&](pool_kind k) { return pool.stats(k).mapped_chunks; };
  std::set<std::byte*> seen;

  auto add_live = [&](packed_handle h, pool_kind k) {
    const auto pattern = static_cast<std::uint8_t>(rng() | 1);
    std::memset(pool.resolve(h).value(), pattern, pool.stats(k).unit_bytes);
    REQUIRE(m.live.emplace(h.bits(), naive_model::live_unit{k, pattern}).second);
    ++m.used[static_cast<int>(k)];
  };

  for (int op = 0; op < ops; ++op) {
    const auto kind = (rng() & 1) ? pool_kind::kv : pool_kind::ssm;
    const int ki = static_cast<int>(kind);
    const std::uint32_t r = static_cast<std::uint32_t>(rng() % 100);
    // Bias towards allocation while the pool is emptyish, towards freeing when full.
    const bool crowded = static_cast<std::int64_t>(m.live.size()) >
                         (pool.stats(pool_kind::kv).total_units + pool.stats(pool_kind::ssm).total_units) / 2;
    if (r < (crowded ? 30u : 55u)) {
      const std::int64_t free_before = pool.stats(kind).free_units;
      auto h = pool.allocate(kind);
      if (h) {
        add_live(*h, kind);
      } else {
        CHECK(h.error() == errc::out_of_capacity);
        CHECK(free_before == 0);                    // never fails while its pool has room
        CHECK(pool.stats(kind).free_units == 0);    // nor after a migration
      }
    } else if (r < 62) {
      const std::size_t n = 1 + rng() % 12;
      std::vector<packed_handle> out(n);
      const auto used_before = pool.stats(kind).used_units;
      auto ok = pool.allocate_n(kind, out, (rng() & 1) != 0);
      if (ok) {
        for (auto h : out) add_live(h, kind);
      } else {
        CHECK(pool.stats(kind).used_units == used_before);  // all or nothing
        CHECK(pool.stats(kind).free_units < n);
      }
    } else if (r < 92 && !m.live.empty()) {
      auto it = m.live.begin();
      std::advance(it, static_cast<long>(rng() % m.live.size()));
      const auto h = packed_handle::from_bits(it->first);
      check_unit(pool, h, it->second, true);
      REQUIRE(pool.free(h).has_value());
      --m.used[static_cast<int>(it->second.kind)];
      m.live.erase(it);
      m.dead.push_back(h);
    } else if (r < 95) {
      // Bad frees: a freed handle (double free or stale), a foreign one. Nothing changes.
      const auto kv_before = pool.stats(pool_kind::kv), ssm_before = pool.stats(pool_kind::ssm);
      if (!m.dead.empty()) {
        const auto h = m.dead[rng() % m.dead.size()];
        auto e = pool.free(h);
        REQUIRE_FALSE(e.has_value());
        CHECK((e.error() == errc::double_free || e.error() == errc::stale_handle));
      }
      CHECK(pool.free(foreign).error() == errc::foreign_handle);
      CHECK(pool.stats(pool_kind::kv).used_units == kv_before.used_units);
      CHECK(pool.stats(pool_kind::ssm).used_units == ssm_before.used_units);
      CHECK(pool.stats(pool_kind::kv).total_units == kv_before.total_units);
    } else if (r < 99) {
      const std::uint32_t recipient_before = chunks_of(kind);
      const auto units = static_cast<std::int64_t>(1 + rng() % 40);
      const std::uint32_t moved = pool.rebalance(kind, units);
      CHECK(chunks_of(kind) == recipient_before + moved);
      const std::uint32_t donor_upc = upc[1 - ki];
      CHECK(moved <= (units + donor_upc - 1) / donor_upc);
    } else {
      (void)pool.maintain();
    }

    // Invariants after every operation.
    REQUIRE(chunks_of(pool_kind::kv) + chunks_of(pool_kind::ssm) == total_chunks);
    REQUIRE(chunks_of(pool_kind::kv) >= 1);
    REQUIRE(chunks_of(pool_kind::ssm) >= 1);
    for (int k = 0; k < 2; ++k) {
      const auto s = pool.stats(static_cast<pool_kind>(k));
      REQUIRE(s.used_units == m.used[k]);
      REQUIRE(s.total_units == std::int64_t{s.mapped_chunks} * upc[k]);
      REQUIRE(s.used_units + s.free_units == s.total_units);
    }
    REQUIRE(pool.live_handles() == static_cast<std::int64_t>(m.live.size()));
    REQUIRE(pool.reserved_bytes() == byte_count{total_chunks} * pool.chunk_bytes());
    if (op % 97 == 0) {
      seen.clear();
      for (const auto& [bits, u] : m.live) {
        const auto h = packed_handle::from_bits(bits);
        REQUIRE(pool.kind_of(h).value() == u.kind);
        REQUIRE(seen.insert(pool.resolve(h).value()).second);
        check_unit(pool, h, u, op % 485 == 0);
      }
    }
  }
  // Drain: everything frees, all capacity is accounted for.
  for (const auto& [bits, u] : m.live) {
    check_unit(pool, packed_handle::from_bits(bits), u, true);
    REQUIRE(pool.free(packed_handle::from_bits(bits)).has_value());
  }
  CHECK(pool.live_handles() == 0);
  CHECK(pool.stats(pool_kind::kv).used_units == 0);
  CHECK(pool.stats(pool_kind::ssm).used_units == 0);
  CHECK(pool.stats(pool_kind::kv).empty_chunks + pool.stats(pool_kind::ssm).empty_chunks == total_chunks);
  MESSAGE("rebalances " << pool.counters().rebalances << ", compactions " << pool.counters().compactions
                        << ", units moved " << pool.counters().units_moved << ", wasted "
                        << pool.counters().bytes_wasted);
}

}  // namespace

TEST_CASE("differential: asymmetric_pool vs naive model, eager rebalancing with compaction") {
  asymmetric_pool_config cfg{.capacity_bytes = 24 * 4096, .kv_page_bytes = 256, .ssm_block_bytes = 1024,
                             .ssm_fraction = 0.5, .granularity_bytes = 4096, .compaction = true};
  rebalancer_config rc{.threshold_low = 0.05, .threshold_high = 0.10, .migration_batch_size = 8,
                       .min_rebalance_interval_ops = 10, .proactive = true, .size_to_demand = true};
  for (std::uint64_t seed : {1u, 2u, 3u}) run_differential(cfg, rc, seed, 6000);
}

TEST_CASE("differential: units that do not divide the chunk (tail waste), paper gates, no compaction") {
  asymmetric_pool_config cfg{.capacity_bytes = 20 * 4096, .kv_page_bytes = 384, .ssm_block_bytes = 1280,
                             .ssm_fraction = 0.3, .granularity_bytes = 4096, .compaction = false};
  rebalancer_config rc{};  // 0.05 / 0.30, batch 128, 1000-op throttle
  rc.migration_batch_size = 16;
  rc.min_rebalance_interval_ops = 50;
  for (std::uint64_t seed : {11u, 12u}) run_differential(cfg, rc, seed, 6000);
}
