// hybridcache/memory/asymmetric_pool.hpp
//
// `asymmetric_pool`: KV pages and SSM blocks in two pools of native unit size over one
// shared physical budget, behind one generation-checked handle table per pool, with
// capacity moved between the pools by remapping whole chunks (AVMP, arXiv 2605.22416).
//
//   budget ─ split into C equal chunks (chunk = largest unit rounded up to the 2 MiB
//            VMM granularity); each chunk is mapped into exactly one pool's range
//   KV pool   chunk = chunk_bytes / kv_page_bytes pages   (jamba: 32 x 64 KiB)
//   SSM pool  chunk = chunk_bytes / ssm_block_bytes blocks (jamba: 8 x 256 KiB)
//
// allocate(kind): a unit from that pool; if it is full, the Rebalancer may plan a
// migration, which the pool carries out by unmapping fully free chunks of the donor (the
// emptiest ones wherever they sit, not the tail; optionally after compacting a sparse
// chunk) and mapping them into the recipient. No bytes are copied and the reserved
// physical memory stays equal to the budget (the reference reserves twice the budget and
// can shrink only from the tail). A migration that would grant nothing is refused; if
// mapping into the recipient fails, every chunk moved so far goes back to the donor.
//
// Costs: allocate/free O(1) without migration and allocation-free; a migration is
// O(chunks moved) plus O(units moved) when compacting. Not thread-safe: one owner (e.g.
// the scheduler thread) calls it, as in vLLM and SGLang.
//
// Device memory (memory/cuda/): a migration unmaps chunks and a compaction copies units
// while kernels may still use them. What the backing needs from the caller is said once on
// its arena (`arena().set_ordering(...)`, remap_order.cuh): the streams whose work may touch
// units (default: every stream of the device) and the stream copies run on; every unmap
// then waits for that work and for the copies, and every copy runs after it. allocate(),
// rebalance() and maintain() may therefore block the host while a migration drains.
#pragma once

#include <algorithm>
#include <type_traits>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/memory/handle_table.hpp"
#include "hybridcache/memory/pool.hpp"
#include "hybridcache/memory/rebalancer.hpp"
#include "hybridcache/memory/stores.hpp"
#include "hybridcache/memory/units.hpp"

namespace hybridcache::memory {

/// Construction parameters of an `asymmetric_pool`.
struct asymmetric_pool_config {
  byte_count capacity_bytes = 0;      ///< physical memory shared by both pools (the budget)
  byte_count kv_page_bytes = 0;       ///< KV unit (see kv_page_bytes())
  byte_count ssm_block_bytes = 0;     ///< SSM unit (see ssm_block_bytes())
  double ssm_fraction = 0.5;          ///< initial share of the chunks given to the SSM pool
  byte_count granularity_bytes = default_granularity_bytes;  ///< physical chunk multiple
  double max_pool_fraction = 1.0;     ///< most of the chunks one pool may ever hold
  bool compaction = false;            ///< empty a sparse donor chunk when none is free
  std::uint32_t pool_tag = 0;         ///< even tag of the KV table (SSM gets tag + 1); 0 = automatic
};

/// KV pages and SSM blocks over one shared, rebalanced budget.
///
/// @tparam HandleTable  models `handle_table` (e.g. unit_handle_table)
/// @tparam KVStore      a `physical_store` of kind kv (e.g. kv_pages_store<counting_backing>)
/// @tparam SSMStore     a `physical_store` of kind ssm over the same backing
/// @tparam Rebalancer   models `rebalancer` (threshold_rebalancer, no_rebalancer)
template <handle_table HandleTable, physical_store KVStore, physical_store SSMStore, rebalancer Rebalancer>
class asymmetric_pool {
  static_assert(KVStore::kind == pool_kind::kv && SSMStore::kind == pool_kind::ssm,
                "asymmetric_pool: KVStore must be a kv store and SSMStore an ssm store");
  static_assert(std::is_same_v<typename KVStore::arena_type, typename SSMStore::arena_type>,
                "asymmetric_pool: both stores must share one backing (one physical arena)");

 public:
  using handle_table_type = HandleTable;
  using kv_store_type = KVStore;
  using ssm_store_type = SSMStore;
  using rebalancer_type = Rebalancer;
  using arena_type = typename KVStore::arena_type;
  static constexpr bool nothrow_mapping = KVStore::nothrow_mapping && SSMStore::nothrow_mapping;

  /// @throws invalid_argument for zero or misaligned unit sizes, fractions outside (0, 1),
  ///         a pool_tag that is odd or > 254; capacity_error if the budget holds fewer than
  ///         two chunks (one per pool); what the arena throws (cuda_error, bad_alloc).
  explicit asymmetric_pool(const asymmetric_pool_config& cfg, Rebalancer rebalancer = Rebalancer{})
      : cfg_(validated(cfg)),
        tag_(cfg_.pool_tag ? cfg_.pool_tag : detail::next_pool_tag()),
        chunk_bytes_(chunk_bytes_for(cfg_)),
        chunks_(static_cast<std::uint32_t>(static_cast<std::uint64_t>(cfg_.capacity_bytes) / chunk_bytes_)),
        max_slots_(std::max<std::uint32_t>(1, static_cast<std::uint32_t>(chunks_ * cfg_.max_pool_fraction))),
        arena_(std::make_unique<arena_type>(chunks_, chunk_bytes_)),
        kv_(*arena_, cfg_.kv_page_bytes, max_slots_),
        ssm_(*arena_, cfg_.ssm_block_bytes, max_slots_),
        kv_table_(tag_, units_capacity(kv_)),
        ssm_table_(tag_ + 1, units_capacity(ssm_)),
        kv_owner_(units_capacity(kv_), 0),
        ssm_owner_(units_capacity(ssm_), 0),
        rebalancer_(std::move(rebalancer)) {
    auto ssm_chunks = static_cast<std::uint32_t>(static_cast<double>(chunks_) * cfg_.ssm_fraction);
    ssm_chunks = std::clamp<std::uint32_t>(ssm_chunks, 1, chunks_ - 1);
    const std::uint32_t kv_chunks = chunks_ - ssm_chunks;
    HYBRIDCACHE_EXPECTS(ssm_chunks <= max_slots_ && kv_chunks <= max_slots_, invalid_argument,
                        "asymmetric_pool: initial split exceeds max_pool_fraction");
    std::uint32_t c = 0;
    for (; c < kv_chunks; ++c) kv_.map_chunk(c);
    for (; c < chunks_; ++c) ssm_.map_chunk(c);
    rebalancer_.observe(occupancy());
  }

  asymmetric_pool(const asymmetric_pool&) = delete;
  asymmetric_pool& operator=(const asymmetric_pool&) = delete;

  // --- allocation -----------------------------------------------------------------------

  /// One unit of `kind`. O(1) unless the rebalancer plans a migration on failure.
  /// errc::out_of_capacity when the pool is full and nothing could be moved.
  [[nodiscard]] expected<packed_handle> allocate(pool_kind kind) noexcept(nothrow_mapping) {
    rebalancer_.on_operation();
    auto u = acquire_unit(kind);
    if (!u) {
      rebalance_on_failure(kind, 1);
      u = acquire_unit(kind);
    }
    if (!u) {
      rebalancer_.observe(occupancy());
      return unexpected(errc::out_of_capacity);
    }
    auto h = issue(kind, *u);
    rebalancer_.observe(occupancy());
    return h;
  }
  [[nodiscard]] expected<packed_handle> allocate_kv() noexcept(nothrow_mapping) { return allocate(pool_kind::kv); }
  [[nodiscard]] expected<packed_handle> allocate_ssm() noexcept(nothrow_mapping) { return allocate(pool_kind::ssm); }

  /// `out.size()` units of `kind`, all or nothing (on failure no unit is taken, though a
  /// migration the rebalancer planned may have moved capacity). With `allow_rebalance`, a
  /// shortfall first asks the rebalancer. O(n). One logical operation.
  [[nodiscard]] expected<void> allocate_n(pool_kind kind, std::span<packed_handle> out,
                                          bool allow_rebalance = true) noexcept(nothrow_mapping) {
    if (out.empty()) return unexpected(errc::invalid_argument);
    rebalancer_.on_operation();
    const auto wanted = static_cast<std::int64_t>(out.size());
    if (free_units(kind) < wanted && allow_rebalance) rebalance_on_failure(kind, wanted - free_units(kind));
    if (free_units(kind) < wanted) {
      rebalancer_.observe(occupancy());
      return unexpected(errc::out_of_capacity);
    }
    for (auto& h : out) h = *issue(kind, *acquire_unit(kind));
    rebalancer_.observe(occupancy());
    return {};
  }

  /// Frees the unit `h` names. O(1). stale_handle, double_free or foreign_handle (a handle
  /// of another pool) are reported and change nothing.
  [[nodiscard]] expected<void> free(packed_handle h) noexcept {
    pool_kind kind;
    if (h.pool_tag() == kv_table_.pool_tag()) kind = pool_kind::kv;
    else if (h.pool_tag() == ssm_table_.pool_tag()) kind = pool_kind::ssm;
    else return unexpected(errc::foreign_handle);
    auto unit = table(kind).erase(h);
    if (!unit) return unexpected(unit.error());
    release_unit(kind, *unit);
    rebalancer_.on_operation();
    rebalancer_.observe(occupancy());
    return {};
  }

  /// Which pool issued `h` (foreign_handle if neither), after checking it is live.
  [[nodiscard]] expected<pool_kind> kind_of(packed_handle h) const noexcept {
    if (h.pool_tag() == kv_table_.pool_tag()) return checked_kind(h, pool_kind::kv);
    if (h.pool_tag() == ssm_table_.pool_tag()) return checked_kind(h, pool_kind::ssm);
    return unexpected(errc::foreign_handle);
  }

  /// The unit index `h` currently names. O(1).
  [[nodiscard]] expected<std::uint32_t> unit_of(packed_handle h) const noexcept {
    auto k = kind_of(h);
    if (!k) return unexpected(k.error());
    return table(*k).resolve(h);
  }

  /// Where the bytes of `h` are (null with counting backings). O(1).
  [[nodiscard]] expected<std::byte*> resolve(packed_handle h) const noexcept {
    auto k = kind_of(h);
    if (!k) return unexpected(k.error());
    const std::uint32_t u = *table(*k).resolve(h);
    return *k == pool_kind::kv ? kv_.address(u) : ssm_.address(u);
  }

  // --- rebalancing ----------------------------------------------------------------------

  /// Moves capacity worth `donor_units` donor units (rounded up to whole chunks) to
  /// `recipient`, bypassing the rebalancer's gates (manual trigger). Returns the chunks
  /// moved; 0 (and the pool unchanged) when nothing could be moved.
  std::uint32_t rebalance(pool_kind recipient, std::int64_t donor_units) noexcept(nothrow_mapping) {
    return donor_units > 0 ? migrate(recipient, static_cast<std::uint64_t>(donor_units)) : 0;
  }

  /// Proactive step (watermarks with hysteresis), meant to run off the allocation path,
  /// e.g. once per scheduler iteration. Returns the chunks moved.
  std::uint32_t maintain() noexcept(nothrow_mapping) {
    const migration_plan p = rebalancer_.proactive(occupancy());
    if (!p) return 0;
    const std::uint32_t moved = migrate(p.recipient, p.donor_units);
    if (moved) rebalancer_.on_committed();
    return moved;
  }

  /// Asks the rebalancer for capacity after `units_needed` units of `kind` did not fit
  /// (what allocate does on failure; exposed for callers with their own eviction ladder).
  /// Returns the chunks moved.
  std::uint32_t rebalance_on_failure(pool_kind kind, std::int64_t units_needed) noexcept(nothrow_mapping) {
    const migration_plan p =
        rebalancer_.on_failure(kind, static_cast<std::uint64_t>(std::max<std::int64_t>(units_needed, 0)), occupancy());
    if (!p) {
      ++counters_.refused;
      return 0;
    }
    const std::uint32_t moved = migrate(kind, p.donor_units);
    if (moved) rebalancer_.on_committed();
    return moved;
  }

  // --- observation ----------------------------------------------------------------------

  [[nodiscard]] pool_stats stats(pool_kind kind) const noexcept {
    const chunk_region& r = region(kind);
    pool_stats s = region_stats(r);
    const auto in_empty = static_cast<std::int64_t>(std::uint64_t{r.empty_chunks()} * r.units_per_chunk());
    s.fragmentation =
        s.free_units ? static_cast<double>(s.free_units - in_empty) / static_cast<double>(s.free_units) : 0.0;
    return s;
  }
  [[nodiscard]] pool_occupancy occupancy() const noexcept {
    return {free_fraction(pool_kind::kv), free_fraction(pool_kind::ssm), kv_.unit_bytes(), ssm_.unit_bytes()};
  }
  [[nodiscard]] const rebalance_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] pressure_state state() const noexcept { return rebalancer_.state(); }
  [[nodiscard]] const Rebalancer& rebalancer_policy() const noexcept { return rebalancer_; }
  [[nodiscard]] std::int64_t free_units(pool_kind k) const noexcept {
    return static_cast<std::int64_t>(region(k).free_units());
  }
  [[nodiscard]] std::int64_t live_handles() const noexcept {
    return static_cast<std::int64_t>(kv_table_.live_count() + ssm_table_.live_count());
  }
  /// Whether capacity ever moves between the sides (false for no_rebalancer).
  static constexpr bool moves_capacity = !std::is_same_v<Rebalancer, no_rebalancer>;
  /// The most units of `k` this pool could ever hold: its share of the chunks at most
  /// (max_pool_fraction), the other side keeping one chunk; with no rebalancer, what it
  /// holds now. O(1).
  [[nodiscard]] std::int64_t max_units(pool_kind k) const noexcept {
    const chunk_region& r = region(k);
    if constexpr (!moves_capacity) return static_cast<std::int64_t>(r.capacity_units());
    return static_cast<std::int64_t>(std::uint64_t{std::min(r.max_slots(), chunks_ - 1)} * r.units_per_chunk());
  }
  /// Whether `kv` pages and `ssm` blocks could be placed at once in this pool once every
  /// unit is free: each side within what it can ever map, and, when capacity moves, the two
  /// sides' chunks within the pool's. O(1).
  [[nodiscard]] bool could_place_when_empty(std::int64_t kv, std::int64_t ssm) const noexcept {
    if (kv < 0 || ssm < 0 || kv > max_units(pool_kind::kv) || ssm > max_units(pool_kind::ssm)) return false;
    if constexpr (!moves_capacity) return true;
    const auto chunks_for = [&](pool_kind k, std::int64_t units) {
      const auto upc = static_cast<std::int64_t>(region(k).units_per_chunk());
      return std::max<std::int64_t>(1, upc == 0 ? 0 : (units + upc - 1) / upc);
    };
    return chunks_for(pool_kind::kv, kv) + chunks_for(pool_kind::ssm, ssm) <= std::int64_t{chunks_};
  }
  /// Physical bytes reserved (equal to the budget rounded down to whole chunks).
  [[nodiscard]] byte_count reserved_bytes() const noexcept { return static_cast<byte_count>(arena_->reserved_bytes()); }
  [[nodiscard]] byte_count chunk_bytes() const noexcept { return static_cast<byte_count>(chunk_bytes_); }
  [[nodiscard]] std::uint32_t chunks() const noexcept { return chunks_; }
  [[nodiscard]] const asymmetric_pool_config& config() const noexcept { return cfg_; }
  [[nodiscard]] const KVStore& kv_store() const noexcept { return kv_; }
  /// The physical arena: for backing-specific setup such as the GPU-work ordering of a
  /// device backing (`arena().set_ordering(...)`).
  [[nodiscard]] arena_type& arena() noexcept { return *arena_; }
  [[nodiscard]] const SSMStore& ssm_store() const noexcept { return ssm_; }
  [[nodiscard]] const chunk_region& region(pool_kind k) const noexcept {
    return k == pool_kind::kv ? kv_.region() : ssm_.region();
  }

 private:
  static asymmetric_pool_config validated(asymmetric_pool_config c) {
    HYBRIDCACHE_EXPECTS(c.kv_page_bytes > 0 && c.ssm_block_bytes > 0, invalid_argument,
                        "asymmetric_pool: kv_page_bytes and ssm_block_bytes must be > 0");
    HYBRIDCACHE_EXPECTS(c.kv_page_bytes % unit_alignment == 0 && c.ssm_block_bytes % unit_alignment == 0,
                        invalid_argument, "asymmetric_pool: unit sizes must be multiples of 128 B");
    HYBRIDCACHE_EXPECTS(c.granularity_bytes > 0 && c.granularity_bytes % unit_alignment == 0, invalid_argument,
                        "asymmetric_pool: granularity_bytes must be a positive multiple of 128 B");
    HYBRIDCACHE_EXPECTS(c.ssm_fraction > 0 && c.ssm_fraction < 1, invalid_argument,
                        "asymmetric_pool: ssm_fraction must be in (0, 1), got " + std::to_string(c.ssm_fraction));
    HYBRIDCACHE_EXPECTS(c.max_pool_fraction > 0 && c.max_pool_fraction <= 1, invalid_argument,
                        "asymmetric_pool: max_pool_fraction must be in (0, 1]");
    HYBRIDCACHE_EXPECTS(c.pool_tag % 2 == 0 && c.pool_tag <= 254, invalid_argument,
                        "asymmetric_pool: pool_tag must be even and <= 254 (the SSM table uses tag + 1)");
    const std::uint64_t chunk = chunk_bytes_for(c);
    HYBRIDCACHE_EXPECTS(c.capacity_bytes >= 0 && static_cast<std::uint64_t>(c.capacity_bytes) / chunk >= 2, capacity_error,
                        "asymmetric_pool: capacity of " + std::to_string(c.capacity_bytes) +
                            " B holds fewer than 2 chunks of " + std::to_string(chunk) +
                            " B (one unit of each pool, rounded up to the granularity)");
    HYBRIDCACHE_EXPECTS(static_cast<std::uint64_t>(c.capacity_bytes) / chunk < 0xffffffffu, invalid_argument, "asymmetric_pool: too many chunks");
    return c;
  }
  // After the positivity checks of validated(): the internal arithmetic is unsigned.
  static std::uint64_t chunk_bytes_for(const asymmetric_pool_config& c) {
    const auto largest = static_cast<std::uint64_t>(std::max(c.kv_page_bytes, c.ssm_block_bytes));
    const auto granularity = static_cast<std::uint64_t>(c.granularity_bytes);
    return (largest + granularity - 1) / granularity * granularity;
  }
  template <class S>
  static std::uint64_t units_capacity(const S& s) noexcept {
    return std::uint64_t{s.region().max_slots()} * s.region().units_per_chunk();
  }

  [[nodiscard]] double free_fraction(pool_kind k) const noexcept {
    const chunk_region& r = region(k);
    return r.capacity_units() ? static_cast<double>(r.free_units()) / static_cast<double>(r.capacity_units()) : 0.0;
  }
  HandleTable& table(pool_kind k) noexcept { return k == pool_kind::kv ? kv_table_ : ssm_table_; }
  const HandleTable& table(pool_kind k) const noexcept { return k == pool_kind::kv ? kv_table_ : ssm_table_; }
  std::vector<std::uint32_t>& owners(pool_kind k) noexcept { return k == pool_kind::kv ? kv_owner_ : ssm_owner_; }

  expected<pool_kind> checked_kind(packed_handle h, pool_kind k) const noexcept {
    const errc e = table(k).validate(h);
    if (e != errc::ok) return unexpected(e);
    return k;
  }
  expected<std::uint32_t> acquire_unit(pool_kind k) noexcept { return k == pool_kind::kv ? kv_.acquire() : ssm_.acquire(); }
  void release_unit(pool_kind k, std::uint32_t u) noexcept {
    if (k == pool_kind::kv) kv_.release(u);
    else ssm_.release(u);
  }
  expected<packed_handle> issue(pool_kind k, std::uint32_t unit) noexcept {
    auto h = table(k).insert(unit);  // cannot fail: the table has a slot per possible unit
    HYBRIDCACHE_ASSERT(h.has_value());
    owners(k)[unit] = h->index();
    return h;
  }

  template <class Donor, class Recipient>
  std::uint32_t migrate_between(Donor& donor, Recipient& recipient, std::uint64_t donor_units) noexcept(nothrow_mapping) {
    const std::uint32_t upc = donor.region().units_per_chunk();
    const auto wanted = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (donor_units + upc - 1) / upc));
    const std::uint32_t room = recipient.region().max_slots() - recipient.region().mapped_chunks();
    const std::uint32_t donor_keep = 1;  // a pool never gives away its last chunk
    const std::uint32_t donor_spare =
        donor.region().mapped_chunks() > donor_keep ? donor.region().mapped_chunks() - donor_keep : 0;
    const std::uint32_t plan = std::min({wanted, room, donor_spare});
    if (plan == 0 || recipient.region().units_per_chunk() == 0) {  // would grant nothing
      ++counters_.refused;
      return 0;
    }
    rebalancer_.set_state(pressure_state::rebalancing);
    std::uint32_t moved = 0;
    // Moves one empty donor chunk (compacting one first if allowed); false when none.
    auto move_one = [&]() noexcept(nothrow_mapping) {
      std::uint32_t slot = donor.region().emptiest_free_slot();
      if (slot == chunk_region::npos && cfg_.compaction) slot = compact(donor);
      if (slot == chunk_region::npos) return false;
      const std::uint32_t phys = donor.unmap_chunk(slot);
      if constexpr (nothrow_mapping) {
        recipient.map_chunk(phys);
      } else {
        try {
          recipient.map_chunk(phys);
        } catch (...) {
          donor.map_chunk(phys);
          throw;
        }
      }
      return true;
    };
    if constexpr (nothrow_mapping) {
      while (moved < plan && move_one()) ++moved;
    } else {
      try {
        while (moved < plan && move_one()) ++moved;
      } catch (...) {
        // Roll back: as many chunks as this migration moved go back to the donor. Chunks
        // are interchangeable and nothing was allocated since, so empty ones are there.
        for (std::uint32_t i = 0; i < moved; ++i) {
          const std::uint32_t s = recipient.region().emptiest_free_slot();
          if (s == chunk_region::npos) break;
          donor.map_chunk(recipient.unmap_chunk(s));
        }
        ++counters_.rollbacks;
        rebalancer_.set_state(pressure_state::balanced);
        rebalancer_.observe(occupancy());
        throw;
      }
    }
    rebalancer_.set_state(pressure_state::balanced);
    if (moved == 0) {
      ++counters_.refused;
      rebalancer_.observe(occupancy());
      return 0;
    }
    ++counters_.rebalances;
    counters_.chunks_migrated += moved;
    counters_.bytes_migrated += std::uint64_t{moved} * chunk_bytes_;
    counters_.bytes_wasted += std::uint64_t{moved} * recipient.region().tail_waste_bytes();
    rebalancer_.observe(occupancy());
    return moved;
  }

  std::uint32_t migrate(pool_kind recipient, std::uint64_t donor_units) noexcept(nothrow_mapping) {
    return recipient == pool_kind::kv ? migrate_between(ssm_, kv_, donor_units)
                                      : migrate_between(kv_, ssm_, donor_units);
  }

  // Empties the sparsest chunk of `store` by moving its live units into other chunks of
  // the same pool (handles are rewritten, callers do not notice). Returns its slot, or
  // npos when the other chunks lack room. O(units per chunk).
  template <class Store>
  std::uint32_t compact(Store& store) noexcept(nothrow_mapping) {
    chunk_region& r = store.region();
    const std::uint32_t slot = r.sparsest_used_slot();
    if (slot == chunk_region::npos) return chunk_region::npos;
    const std::uint32_t live = r.used_in(slot);
    const std::uint64_t room_elsewhere = r.free_units() - (r.units_per_chunk() - live);
    if (room_elsewhere < live) return chunk_region::npos;
    auto& owner = owners(Store::kind);
    auto& tbl = table(Store::kind);
    r.begin_drain(slot);
    const std::uint32_t first = slot * r.units_per_chunk();
    for (std::uint32_t u = first; u < first + r.units_per_chunk() && r.used_in(slot) > 0; ++u) {
      if (!r.is_live(u)) continue;
      const std::uint32_t dst = *r.acquire();
      store.copy_unit(dst, u);
      tbl.relocate(owner[u], dst);
      owner[dst] = owner[u];
      r.release(u);
      ++counters_.units_moved;
    }
    r.end_drain(slot);
    ++counters_.compactions;
    return slot;
  }

  asymmetric_pool_config cfg_;
  std::uint32_t tag_;
  std::uint64_t chunk_bytes_;
  std::uint32_t chunks_;
  std::uint32_t max_slots_;
  std::unique_ptr<arena_type> arena_;
  KVStore kv_;
  SSMStore ssm_;
  HandleTable kv_table_;
  HandleTable ssm_table_;
  std::vector<std::uint32_t> kv_owner_;
  std::vector<std::uint32_t> ssm_owner_;
  Rebalancer rebalancer_;
  rebalance_counters counters_;
};

static_assert(kv_ssm_pool<asymmetric_pool<unit_handle_table, kv_pages_store<counting_backing>,
                                          ssm_blocks_store<counting_backing>, threshold_rebalancer>>);
static_assert(rebalancing_pool<asymmetric_pool<unit_handle_table, kv_pages_store<counting_backing>,
                                               ssm_blocks_store<counting_backing>, threshold_rebalancer>>);
static_assert(rebalancing_pool<asymmetric_pool<unit_handle_table, kv_pages_store<counting_backing>,
                                               ssm_blocks_store<counting_backing>, no_rebalancer>>);

/// The simulated-VMM pool: chunk logic of the CUDA VMM store, no memory (replay, tests).
template <rebalancer Rebalancer = threshold_rebalancer>
using simulated_vmm_pool = asymmetric_pool<unit_handle_table, kv_pages_store<counting_backing>,
                                           ssm_blocks_store<counting_backing>, Rebalancer>;

/// The same pool over host memory (addresses are real, capacity moves without copying).
template <rebalancer Rebalancer = threshold_rebalancer>
using host_asymmetric_pool =
    asymmetric_pool<unit_handle_table, kv_pages_store<host_backing>, ssm_blocks_store<host_backing>, Rebalancer>;

}  // namespace hybridcache::memory
