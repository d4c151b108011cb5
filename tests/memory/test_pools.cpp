// Unit tests of the memory layer: unit sizes, handle table, chunk regions, stores,
// rebalancer state machine, asymmetric pool (migration, rollback, compaction, bad input)
// and the two baselines, plus a conformance suite run on every kv_ssm_pool.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/memory/asymmetric_pool.hpp>
#include <hybridcache/memory/fixed_dual_pool.hpp>
#include <hybridcache/memory/padded_unified_pool.hpp>

using namespace hybridcache;
using namespace hybridcache::memory;

namespace {

constexpr byte_count MiB = byte_count{1} << 20;
constexpr byte_count GiB = byte_count{1} << 30;

// Small geometry used by most tests: 4 KiB chunks, 256 B KV pages (16 per chunk), 1 KiB
// SSM blocks (4 per chunk), 16 chunks.
asymmetric_pool_config small_config() {
  return {.capacity_bytes = 16 * 4096, .kv_page_bytes = 256, .ssm_block_bytes = 1024, .ssm_fraction = 0.5,
          .granularity_bytes = 4096};
}

rebalancer_config eager() {  // migrations allowed whenever the donor has any free space
  return {.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 4, .min_rebalance_interval_ops = 0};
}

template <class Pool>
std::vector<packed_handle> fill(Pool& pool, pool_kind k) {
  std::vector<packed_handle> hs;
  for (;;) {
    auto h = pool.allocate(k);
    if (!h) break;
    hs.push_back(*h);
  }
  return hs;
}

// A backing whose map fails on demand, to exercise rollback.
struct flaky_backing {
  static constexpr bool holds_memory = false;
  static inline int maps_until_failure = -1;  // <0: never fail
  using arena = counting_backing::arena;
  class view {
   public:
    view(arena&, std::uint32_t) {}
    void map(std::uint32_t, std::uint32_t) {
      if (maps_until_failure == 0) {
        maps_until_failure = -1;  // fail once
        throw cuda_error("cuMemMap failed: CUDA_ERROR_OUT_OF_MEMORY (test)");
      }
      if (maps_until_failure > 0) --maps_until_failure;
    }
    void unmap(std::uint32_t) {}
    [[nodiscard]] std::byte* slot_base(std::uint32_t) const noexcept { return nullptr; }
    void copy(std::byte*, const std::byte*, std::uint64_t) {}
  };
};
static_assert(memory_backing<flaky_backing>);
static_assert(!nothrow_backing_v<flaky_backing>);

using small_pool = host_asymmetric_pool<threshold_rebalancer>;

struct pool_snapshot {
  pool_stats kv, ssm;
  std::int64_t live;
  template <class P>
  static pool_snapshot of(const P& p) {
    return {p.stats(pool_kind::kv), p.stats(pool_kind::ssm), p.live_handles()};
  }
  bool operator==(const pool_snapshot& o) const {
    return kv.total_units == o.kv.total_units && kv.used_units == o.kv.used_units &&
           ssm.total_units == o.ssm.total_units && ssm.used_units == o.ssm.used_units && live == o.live;
  }
};

}  // namespace

namespace {
struct store_without_release {  // misses release(): not a physical_store
  using backing_type = counting_backing;
  using arena_type = counting_backing::arena;
  static constexpr pool_kind kind = pool_kind::kv;
  store_without_release(arena_type&, std::uint64_t, std::uint32_t) {}
  expected<std::uint32_t> acquire() noexcept { return 0u; }
};
}  // namespace

// Concepts reject what does not model them.
static_assert(!physical_store<store_without_release>);
static_assert(!handle_table<generation_table>);  // no unit payload, no relocate
static_assert(!rebalancer<int>);
static_assert(!memory_backing<int>);
static_assert(!kv_ssm_pool<unit_handle_table>);
static_assert(kv_ssm_pool<simulated_vmm_pool<no_rebalancer>>);

TEST_CASE("unit sizes reproduce the AVMP reference") {
  const cost_model jamba(presets::jamba_1_5_mini());
  const cost_model mamba2(presets::mamba2_1b3());
  CHECK(kv_page_bytes(jamba) == 65536);
  CHECK(ssm_block_bytes(jamba) == 262144);
  CHECK(kv_page_bytes(mamba2) == 65536);
  CHECK(ssm_block_bytes(mamba2) == 2097152);
  CHECK(kv_page_bytes(jamba, 16, 4) == 4 * 65536);
  CHECK(align_up(1) == 128);
  CHECK(align_up(129) == 256);
  CHECK_THROWS_AS((void)align_up(0), invalid_argument);
  CHECK_THROWS_AS((void)align_up(-5), invalid_argument);
  CHECK_THROWS_AS((void)kv_page_bytes(jamba, 0), invalid_argument);
  CHECK_THROWS_AS((void)ssm_block_bytes(cost_model(presets::llama2_7b())), invalid_argument);
  CHECK_THROWS_AS((void)kv_page_bytes(cost_model(presets::mamba2_1b3_pure())), invalid_argument);
}

TEST_CASE("unit_handle_table resolves in O(1) and reports stale, double and foreign handles") {
  unit_handle_table t(7, 4), other(9, 4);
  auto a = t.insert(40).value();
  auto b = t.insert(41).value();
  CHECK(t.resolve(a).value() == 40);
  CHECK(t.resolve(b).value() == 41);
  CHECK(t.erase(a).value() == 40);
  CHECK(t.erase(a).error() == errc::double_free);
  CHECK(t.resolve(a).error() == errc::double_free);
  auto c = t.insert(42).value();  // reuses a's slot
  CHECK(c.index() == a.index());
  CHECK(t.resolve(a).error() == errc::stale_handle);
  CHECK(t.erase(a).error() == errc::stale_handle);
  CHECK(t.resolve(c).value() == 42);
  auto foreign = other.insert(1).value();
  CHECK(t.resolve(foreign).error() == errc::foreign_handle);
  CHECK(t.erase(packed_handle::make(7, 99, 1)).error() == errc::foreign_handle);  // index out of range
  CHECK(t.resolve(packed_handle{}).error() == errc::foreign_handle);
  t.relocate(c.index(), 77);
  CHECK(t.resolve(c).value() == 77);
  CHECK(t.live_count() == 2);
  (void)t.insert(1);
  (void)t.insert(2);
  CHECK(t.insert(3).error() == errc::out_of_capacity);
}

TEST_CASE("chunk_region packs units into the fullest chunk and keeps empty chunks donatable") {
  chunk_region r(256, 1024, 4);  // 4 units per chunk
  CHECK(r.units_per_chunk() == 4);
  CHECK(r.acquire().error() == errc::out_of_capacity);
  const auto s0 = r.map(10), s1 = r.map(11);
  CHECK(s0 == 0);
  CHECK(s1 == 1);
  CHECK(r.physical_of(s1) == 11);
  CHECK(r.empty_chunks() == 2);
  std::vector<std::uint32_t> us;
  for (int i = 0; i < 3; ++i) us.push_back(r.acquire().value());
  // All three in one chunk: the other stays empty.
  CHECK(r.slot_of(us[0]) == r.slot_of(us[2]));
  CHECK(r.empty_chunks() == 1);
  const std::uint32_t empty_slot = r.emptiest_free_slot();
  CHECK(empty_slot != r.slot_of(us[0]));
  CHECK(r.unmap(empty_slot) == r.physical_of(empty_slot));
  CHECK(r.capacity_units() == 4);
  CHECK(r.free_units() == 1);
  CHECK(r.sparsest_used_slot() == r.slot_of(us[0]));
  r.release(us[1]);
  CHECK_FALSE(r.is_live(us[1]));
  CHECK(r.used_units() == 2);
  // Draining hides a chunk from placement.
  (void)r.map(12);
  r.begin_drain(r.slot_of(us[0]));
  const auto moved = r.acquire().value();
  CHECK(r.slot_of(moved) != r.slot_of(us[0]));
  r.end_drain(r.slot_of(us[0]));
  CHECK_THROWS_AS(chunk_region(0, 1024, 1), invalid_argument);
  CHECK_THROWS_AS(chunk_region(2048, 1024, 1), invalid_argument);
}

TEST_CASE("chunk_region with many units per chunk (quantized buckets) stays exact on empty/full") {
  chunk_region r(128, 128 * 1000, 3);
  for (std::uint32_t p = 0; p < 3; ++p) (void)r.map(p);
  std::vector<std::uint32_t> us;
  for (int i = 0; i < 1500; ++i) us.push_back(r.acquire().value());
  CHECK(r.empty_chunks() == 1);  // 1000 + 500, third chunk untouched
  for (int i = 0; i < 1500; ++i) r.release(us[static_cast<std::size_t>(i)]);
  CHECK(r.empty_chunks() == 3);
  CHECK(r.emptiest_free_slot() != chunk_region::npos);
}

TEST_CASE("asymmetric_pool: layout, O(1) allocate/free, addresses, stats") {
  small_pool pool(small_config(), threshold_rebalancer(eager()));
  CHECK(pool.chunks() == 16);
  CHECK(pool.chunk_bytes() == 4096);
  CHECK(pool.reserved_bytes() == 16 * 4096);
  CHECK(pool.stats(pool_kind::kv).total_units == 8 * 16);
  CHECK(pool.stats(pool_kind::ssm).total_units == 8 * 4);
  auto k = pool.allocate_kv().value();
  auto s = pool.allocate_ssm().value();
  CHECK(pool.kind_of(k).value() == pool_kind::kv);
  CHECK(pool.kind_of(s).value() == pool_kind::ssm);
  std::byte* pk = pool.resolve(k).value();
  std::byte* ps = pool.resolve(s).value();
  REQUIRE(pk != nullptr);
  REQUIRE(ps != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(pk) % 128 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(ps) % 128 == 0);
  std::memset(pk, 0xab, 256);
  std::memset(ps, 0xcd, 1024);
  CHECK(pk[255] == std::byte{0xab});
  CHECK(pool.stats(pool_kind::kv).used_units == 1);
  CHECK(pool.stats(pool_kind::kv).fragmentation > 0);  // 15 free units stranded in a used chunk
  CHECK(pool.free(k).has_value());
  CHECK(pool.free(s).has_value());
  CHECK(pool.live_handles() == 0);
  CHECK(pool.stats(pool_kind::kv).fragmentation == 0);
}

TEST_CASE("pools: negative byte amounts (byte_count is signed) are refused with a message naming them") {
  // asymmetric_pool, fixed_dual_pool and padded_unified_pool: a negative capacity or unit size
  // is an error, never wrapped into a huge unsigned budget.
  CHECK_THROWS_WITH_AS(small_pool({.capacity_bytes = -65536, .kv_page_bytes = 256, .ssm_block_bytes = 1024,
                                   .granularity_bytes = 4096}),
                       doctest::Contains("capacity of -65536 B"), capacity_error);
  CHECK_THROWS_AS(small_pool({.capacity_bytes = 65536, .kv_page_bytes = -256, .ssm_block_bytes = 1024,
                              .granularity_bytes = 4096}),
                  invalid_argument);
  CHECK_THROWS_AS(small_pool({.capacity_bytes = 65536, .kv_page_bytes = 256, .ssm_block_bytes = 1024,
                              .granularity_bytes = -4096}),
                  invalid_argument);
  CHECK_THROWS_WITH_AS(fixed_dual_pool<>({.capacity_bytes = -GiB, .kv_page_bytes = 65536, .ssm_block_bytes = 262144}),
                       doctest::Contains("capacity of -1073741824 B"), capacity_error);
  CHECK_THROWS_AS(fixed_dual_pool<>({.capacity_bytes = GiB, .kv_page_bytes = -65536, .ssm_block_bytes = 262144}),
                  invalid_argument);
  CHECK_THROWS_WITH_AS(padded_unified_pool<>({.capacity_bytes = -GiB, .kv_page_bytes = 65536, .ssm_block_bytes = 262144}),
                       doctest::Contains("capacity of -1073741824 B"), capacity_error);
  CHECK_THROWS_AS(padded_unified_pool<>({.capacity_bytes = GiB, .kv_page_bytes = 65536, .ssm_block_bytes = -262144}),
                  invalid_argument);
}

TEST_CASE("asymmetric_pool: bad input leaves the pool unchanged") {
  CHECK_THROWS_AS(small_pool({.capacity_bytes = 4096, .kv_page_bytes = 256, .ssm_block_bytes = 1024,
                              .granularity_bytes = 4096}),
                  capacity_error);  // one chunk: no room for both pools
  CHECK_THROWS_AS(small_pool({.capacity_bytes = 65536, .kv_page_bytes = 0, .ssm_block_bytes = 1024,
                              .granularity_bytes = 4096}),
                  invalid_argument);
  CHECK_THROWS_AS(small_pool({.capacity_bytes = 65536, .kv_page_bytes = 100, .ssm_block_bytes = 1024,
                              .granularity_bytes = 4096}),
                  invalid_argument);
  auto bad_fraction = small_config();
  bad_fraction.ssm_fraction = 1.0;
  CHECK_THROWS_AS(small_pool{bad_fraction}, invalid_argument);
  auto bad_tag = small_config();
  bad_tag.pool_tag = 3;
  CHECK_THROWS_AS(small_pool{bad_tag}, invalid_argument);
  CHECK_THROWS_AS(threshold_rebalancer({.threshold_low = 0.3, .threshold_high = 0.3}), invalid_argument);
  CHECK_THROWS_AS(threshold_rebalancer({.threshold_low = 0.5, .threshold_high = 0.3}), invalid_argument);
  CHECK_THROWS_AS(threshold_rebalancer({.migration_batch_size = 0}), invalid_argument);
  CHECK_THROWS_AS(simulated_vmm_pool<>({.capacity_bytes = 3 * MiB, .kv_page_bytes = 65536, .ssm_block_bytes = 2 * MiB}),
                  capacity_error);  // one 2 MiB chunk only

  small_pool pool(small_config()), other(small_config());
  auto k = pool.allocate_kv().value();
  auto s = pool.allocate_ssm().value();
  auto foreign = other.allocate_kv().value();
  const auto before = pool_snapshot::of(pool);
  CHECK(pool.free(foreign).error() == errc::foreign_handle);
  CHECK(pool.resolve(foreign).error() == errc::foreign_handle);
  CHECK(pool.free(packed_handle{}).error() == errc::foreign_handle);
  CHECK(pool.free(packed_handle::make(k.pool_tag(), 100000, 1)).error() == errc::foreign_handle);
  std::array<packed_handle, 0> none{};
  CHECK(pool.allocate_n(pool_kind::kv, none).error() == errc::invalid_argument);
  CHECK(pool_snapshot::of(pool) == before);
  REQUIRE(pool.free(k).has_value());
  const auto after_free = pool_snapshot::of(pool);
  CHECK(pool.free(k).error() == errc::double_free);
  CHECK(pool_snapshot::of(pool) == after_free);
  auto k2 = pool.allocate_kv().value();  // reuses k's slot
  const auto after_reuse = pool_snapshot::of(pool);
  CHECK(pool.free(k).error() == errc::stale_handle);
  CHECK(pool.resolve(k).error() == errc::stale_handle);
  CHECK(pool_snapshot::of(pool) == after_reuse);
  CHECK(pool.free(k2).has_value());
  CHECK(pool.free(s).has_value());
}

TEST_CASE("asymmetric_pool: an allocation failure migrates whole chunks from the other pool") {
  small_pool pool(small_config(), threshold_rebalancer(eager()));
  auto kv = fill(pool, pool_kind::kv);
  // 8 chunks x 16 + the migrated ones: every SSM chunk except the last one it keeps.
  CHECK(pool.counters().rebalances > 0);
  CHECK(pool.stats(pool_kind::ssm).mapped_chunks == 1);
  CHECK(pool.stats(pool_kind::kv).mapped_chunks == 15);
  CHECK(kv.size() == 15 * 16);
  CHECK(pool.counters().bytes_migrated == 7 * 4096);
  CHECK(pool.counters().bytes_wasted == 0);
  CHECK(pool.reserved_bytes() == 16 * 4096);  // capacity moved, nothing reserved twice
  // Donation picks any empty chunk, not the tail: free a chunk in the middle and move it back.
  for (std::size_t i = 16 * 5; i < 16 * 6; ++i) REQUIRE(pool.free(kv[i]).has_value());
  CHECK(pool.rebalance(pool_kind::ssm, 1) == 1);
  CHECK(pool.stats(pool_kind::ssm).mapped_chunks == 2);
  for (std::size_t i = 0; i < kv.size(); ++i)
    if (i < 16 * 5 || i >= 16 * 6) CHECK(pool.free(kv[i]).has_value());
}

TEST_CASE("asymmetric_pool: thresholds and throttle change behaviour") {
  // KV holds 64 of its 128 pages (4 full chunks, 4 empty); then SSM is filled until an
  // allocation fails. Every migration takes empty KV chunks.
  auto run = [](rebalancer_config rc) {
    small_pool pool(small_config(), threshold_rebalancer(rc));
    for (int i = 0; i < 64; ++i) REQUIRE(pool.allocate_kv().has_value());
    auto ssm = fill(pool, pool_kind::ssm);
    return std::pair{ssm.size(), pool.counters()};
  };
  // Gate 0.30: KV donates while its free fraction 1 - 4/(8 - d) exceeds 0.30, i.e. 3 chunks.
  auto open = run({.threshold_low = 0.0, .threshold_high = 0.30, .migration_batch_size = 4,
                   .min_rebalance_interval_ops = 0});
  CHECK(open.first == 32 + 3 * 4);
  CHECK(open.second.rebalances == 3);
  // Gate 0.999 never opens.
  auto closed = run({.threshold_low = 0.0, .threshold_high = 0.999, .migration_batch_size = 4,
                     .min_rebalance_interval_ops = 0});
  CHECK(closed.first == 32);
  CHECK(closed.second.rebalances == 0);
  CHECK(closed.second.refused > 0);
  // Gate 0.01: all 4 empty chunks go.
  auto unthrottled = run({.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 4,
                          .min_rebalance_interval_ops = 0});
  CHECK(unthrottled.first == 32 + 4 * 4);
  CHECK(unthrottled.second.rebalances == 4);
  // Throttle: with a 1000-op interval only the first failure migrates.
  auto throttled = run({.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 4,
                        .min_rebalance_interval_ops = 1000});
  CHECK(throttled.first == 32 + 4);
  CHECK(throttled.second.rebalances == 1);
  // Batch size in donor units: 16 KV pages = 1 chunk, 64 = 4 chunks.
  auto one = run({.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 16,
                  .min_rebalance_interval_ops = 1000});
  auto four = run({.threshold_low = 0.0, .threshold_high = 0.01, .migration_batch_size = 64,
                   .min_rebalance_interval_ops = 1000});
  CHECK(one.second.chunks_migrated == 1);
  CHECK(four.second.chunks_migrated == 4);
  CHECK(four.first == 32 + 16);
}

TEST_CASE("asymmetric_pool: pressure state machine and proactive watermarks with hysteresis") {
  small_pool pool(small_config(), threshold_rebalancer({.threshold_low = 0.10, .threshold_high = 0.30,
                                                        .migration_batch_size = 4,
                                                        .min_rebalance_interval_ops = 0, .proactive = true}));
  CHECK(pool.state() == pressure_state::balanced);
  std::vector<packed_handle> kv;
  for (int i = 0; i < 8 * 16 - 4; ++i) kv.push_back(pool.allocate_kv().value());  // kv free 4/128 < 0.10
  CHECK(pool.state() == pressure_state::kv_pressured);
  CHECK(pool.counters().rebalances == 0);  // nothing moves on the allocation path
  CHECK(pool.maintain() == 1);             // one batch (1 chunk) per call
  CHECK(pool.counters().rebalances == 1);
  // free 20/144 = 0.14 > low but < midpoint 0.2: hysteresis keeps the episode going
  CHECK(pool.stats(pool_kind::kv).free_fraction < 0.2);
  CHECK(pool.maintain() == 1);
  CHECK(pool.stats(pool_kind::kv).free_fraction >= 0.2);
  CHECK(pool.maintain() == 0);  // episode over
  CHECK(pool.state() == pressure_state::balanced);
  for (auto h : kv) REQUIRE(pool.free(h).has_value());
  small_pool ssm_side(small_config(), threshold_rebalancer({.threshold_low = 0.10, .threshold_high = 0.30}));
  for (int i = 0; i < 8 * 4; ++i) (void)ssm_side.allocate_ssm().value();
  CHECK(ssm_side.state() == pressure_state::ssm_pressured);
  CHECK(ssm_side.maintain() == 0);  // proactive off by default
  CHECK(to_string(pressure_state::rebalancing) == "REBALANCING");
}

TEST_CASE("asymmetric_pool: migrations that grant nothing are refused; a full recipient takes nothing") {
  auto cfg = small_config();
  small_pool pool(cfg, threshold_rebalancer(eager()));
  // Fragment the SSM pool: one live block in every SSM chunk, so no chunk is empty.
  std::vector<packed_handle> all = fill(pool, pool_kind::ssm);
  const auto total_ssm = all.size();
  std::vector<packed_handle> keep;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (i % 4 == 0) keep.push_back(all[i]);
    else REQUIRE(pool.free(all[i]).has_value());
  CHECK(pool.stats(pool_kind::ssm).empty_chunks == 0);
  const auto before = pool_snapshot::of(pool);
  const auto refused = pool.counters().refused;
  CHECK(pool.rebalance(pool_kind::kv, 4) == 0);  // no empty donor chunk, compaction off
  CHECK(pool.counters().refused == refused + 1);
  CHECK(pool_snapshot::of(pool) == before);
  CHECK(total_ssm > 0);

  auto capped = small_config();
  capped.max_pool_fraction = 0.5;  // each pool at most 8 chunks: it starts at 8
  small_pool full(capped, threshold_rebalancer(eager()));
  const auto b2 = pool_snapshot::of(full);
  CHECK(full.rebalance(pool_kind::kv, 16) == 0);
  CHECK(pool_snapshot::of(full) == b2);
  CHECK(fill(full, pool_kind::kv).size() == 8 * 16);
}

TEST_CASE("asymmetric_pool: compaction empties the sparsest chunk and keeps data and handles valid") {
  auto cfg = small_config();
  cfg.compaction = true;
  small_pool pool(cfg, threshold_rebalancer(eager()));
  std::vector<packed_handle> all = fill(pool, pool_kind::ssm);  // migrates KV chunks in, too
  std::vector<packed_handle> keep;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (i % 4 == 0) keep.push_back(all[i]);
    else REQUIRE(pool.free(all[i]).has_value());
  for (std::size_t i = 0; i < keep.size(); ++i)
    std::memset(pool.resolve(keep[i]).value(), static_cast<int>(i + 1), 1024);
  const auto ssm_chunks = pool.stats(pool_kind::ssm).mapped_chunks;
  CHECK(pool.rebalance(pool_kind::kv, 8) == 2);
  CHECK(pool.counters().compactions == 2);
  CHECK(pool.counters().units_moved == 2);
  CHECK(pool.stats(pool_kind::ssm).mapped_chunks == ssm_chunks - 2);
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const std::byte* p = pool.resolve(keep[i]).value();
    bool intact = true;
    for (int b = 0; b < 1024; ++b) intact &= p[b] == static_cast<std::byte>(i + 1);
    CHECK(intact);
  }
  for (auto h : keep) CHECK(pool.free(h).has_value());
}

TEST_CASE("asymmetric_pool: a failed map rolls the whole migration back and reports the CUDA error") {
  using flaky_pool =
      asymmetric_pool<unit_handle_table, kv_pages_store<flaky_backing>, ssm_blocks_store<flaky_backing>,
                      threshold_rebalancer>;
  static_assert(!flaky_pool::nothrow_mapping);
  flaky_backing::maps_until_failure = -1;
  flaky_pool pool(small_config(), threshold_rebalancer(eager()));
  auto k = pool.allocate_kv().value();
  const auto before = pool_snapshot::of(pool);
  flaky_backing::maps_until_failure = 2;  // two chunks map, the third fails
  CHECK_THROWS_WITH_AS(pool.rebalance(pool_kind::kv, 16), doctest::Contains("cuMemMap"), cuda_error);
  flaky_backing::maps_until_failure = -1;
  CHECK(pool_snapshot::of(pool) == before);
  CHECK(pool.counters().rollbacks == 1);
  CHECK(pool.counters().rebalances == 0);
  CHECK(pool.rebalance(pool_kind::kv, 16) == 4);
  CHECK(pool.free(k).has_value());
}

TEST_CASE("fixed_dual_pool: the reference's static split, exactly") {
  const cost_model jamba(presets::jamba_1_5_mini());
  const cost_model mamba2(presets::mamba2_1b3());
  fixed_dual_pool<> fd05({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(jamba),
                          .ssm_block_bytes = ssm_block_bytes(jamba), .ssm_ratio = 0.5});
  CHECK(fd05.stats(pool_kind::kv).total_units == 8192);
  CHECK(fd05.stats(pool_kind::ssm).total_units == 2048);
  fixed_dual_pool<> fd09({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(jamba),
                          .ssm_block_bytes = ssm_block_bytes(jamba)});
  CHECK(fd09.stats(pool_kind::kv).total_units == 1638);
  CHECK(fd09.stats(pool_kind::ssm).total_units == 3686);
  fixed_dual_pool<> m09({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(mamba2),
                         .ssm_block_bytes = ssm_block_bytes(mamba2)});
  CHECK(m09.stats(pool_kind::ssm).total_units == 460);
  // No movement: SSM full stays full although KV is empty.
  CHECK(fill(fd09, pool_kind::ssm).size() == 3686);
  CHECK(fd09.allocate(pool_kind::ssm).error() == errc::out_of_capacity);
  CHECK(fd09.stats(pool_kind::kv).used_units == 0);
  CHECK_THROWS_AS(fixed_dual_pool<>({.capacity_bytes = 300000, .kv_page_bytes = 65536, .ssm_block_bytes = 262144,
                                     .ssm_ratio = 0.5}),
                  capacity_error);
  CHECK_THROWS_AS(fixed_dual_pool<>({.capacity_bytes = GiB, .kv_page_bytes = 65536, .ssm_block_bytes = 262144,
                                     .ssm_ratio = 0.0}),
                  invalid_argument);
}

TEST_CASE("padded_unified_pool: one page size, padding waste accounted") {
  const cost_model jamba(presets::jamba_1_5_mini());
  padded_unified_pool<> pool({.capacity_bytes = GiB, .kv_page_bytes = kv_page_bytes(jamba),
                              .ssm_block_bytes = ssm_block_bytes(jamba)});
  CHECK(pool.page_bytes() == 262144);
  CHECK(pool.stats(pool_kind::kv).total_units == 4096);
  auto k = pool.allocate(pool_kind::kv).value();
  auto s = pool.allocate(pool_kind::ssm).value();
  CHECK(pool.padding_waste_bytes() == 262144 - 65536);
  CHECK(pool.kind_of(k).value() == pool_kind::kv);
  CHECK(pool.kind_of(s).value() == pool_kind::ssm);
  CHECK(pool.stats(pool_kind::kv).used_units == 1);
  CHECK(pool.free(k).has_value());
  CHECK(pool.padding_waste_bytes() == 0);
  CHECK(pool.free(k).error() == errc::double_free);
  CHECK(pool.free(s).has_value());
  CHECK_THROWS_AS(padded_unified_pool<>({.capacity_bytes = 1000, .kv_page_bytes = 256, .ssm_block_bytes = 1024}),
                  capacity_error);
}

// --- conformance: laws every kv_ssm_pool obeys ------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("kv_ssm_pool conformance", Pool, pool_conformance) {
  static_assert(kv_ssm_pool<Pool>);
  auto make = [] {
    if constexpr (requires { typename Pool::rebalancer_type; })
      return Pool(small_config(), typename Pool::rebalancer_type{});
    else if constexpr (std::is_same_v<Pool, fixed_dual_pool<host_backing>>)
      return Pool({.capacity_bytes = 16 * 4096, .kv_page_bytes = 256, .ssm_block_bytes = 1024, .ssm_ratio = 0.5});
    else
      return Pool({.capacity_bytes = 16 * 4096, .kv_page_bytes = 256, .ssm_block_bytes = 1024});
  };
  Pool pool = make();
  std::vector<packed_handle> hs;
  std::set<std::byte*> addresses;
  for (int i = 0;; ++i) {
    auto h = pool.allocate(i % 3 == 0 ? pool_kind::ssm : pool_kind::kv);
    if (!h) {
      CHECK(h.error() == errc::out_of_capacity);
      break;
    }
    hs.push_back(*h);
    CHECK(addresses.insert(pool.resolve(*h).value()).second);  // no two live units share bytes
  }
  CHECK(hs.size() > 0);
  std::array<packed_handle, 2> two{};
  for (auto h : hs) CHECK(pool.free(h).has_value());
  for (auto h : hs) CHECK_FALSE(pool.free(h).has_value());
  CHECK(pool.stats(pool_kind::kv).used_units == 0);
  CHECK(pool.stats(pool_kind::ssm).used_units == 0);
  CHECK(pool.allocate_n(pool_kind::kv, two, true).has_value());
  CHECK(pool.reserved_bytes() <= 16 * 4096);
}
TEST_CASE_TEMPLATE_INVOKE(pool_conformance, host_asymmetric_pool<threshold_rebalancer>,
                          host_asymmetric_pool<no_rebalancer>, fixed_dual_pool<host_backing>,
                          padded_unified_pool<host_backing>);
