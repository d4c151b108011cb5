// hybridcache/memory/pool.hpp
//
// What every KV/SSM pool offers (`kv_ssm_pool`), and the statistics types they share:
// asymmetric_pool, padded_unified_pool and fixed_dual_pool all model it, so replay
// engines and the prefix cache's state-store adaptor take any of them.
#pragma once

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/memory/chunk_region.hpp"
#include "hybridcache/memory/units.hpp"

namespace hybridcache::memory {

/// Per-pool occupancy.
struct pool_stats {
  std::uint64_t unit_bytes = 0;
  std::uint64_t total_units = 0;
  std::uint64_t used_units = 0;
  std::uint64_t free_units = 0;
  std::uint32_t mapped_chunks = 0;
  std::uint32_t empty_chunks = 0;
  /// free / total (the reference's "fragmentation"; 0 for an empty pool).
  double free_fraction = 0;
  /// Share of the free units stranded in partly used chunks, which cannot be donated
  /// without compaction (external fragmentation at chunk granularity).
  double fragmentation = 0;
  [[nodiscard]] std::uint64_t total_bytes() const noexcept { return total_units * unit_bytes; }
};

/// The occupancy of a pool that is one chunk_region: every field but `fragmentation`
/// (left 0; pools that report it compute it on top). O(1).
[[nodiscard]] inline pool_stats region_stats(const chunk_region& r) noexcept {
  pool_stats s;
  s.unit_bytes = r.unit_bytes();
  s.total_units = r.capacity_units();
  s.used_units = r.used_units();
  s.free_units = r.free_units();
  s.mapped_chunks = r.mapped_chunks();
  s.empty_chunks = r.empty_chunks();
  s.free_fraction = s.total_units ? static_cast<double>(s.free_units) / static_cast<double>(s.total_units) : 0.0;
  return s;
}

/// Counters of capacity movement (all zero for static pools).
struct rebalance_counters {
  std::uint64_t rebalances = 0;      ///< committed migrations
  std::uint64_t chunks_migrated = 0;
  std::uint64_t bytes_migrated = 0;  ///< physical bytes remapped
  std::uint64_t bytes_wasted = 0;    ///< migrated bytes the recipient's unit size cannot use
  std::uint64_t refused = 0;         ///< plans refused by the rebalancer or with nothing to move
  std::uint64_t rollbacks = 0;       ///< migrations undone because the recipient failed
  std::uint64_t compactions = 0;     ///< chunks emptied by moving live units
  std::uint64_t units_moved = 0;     ///< live units copied by compaction
};

/// A pool of KV pages and SSM blocks addressed by generation-checked handles.
template <class P>
concept kv_ssm_pool = requires(P& p, const P& cp, pool_kind k, packed_handle h, std::span<packed_handle> out) {
  { p.allocate(k) } -> std::same_as<expected<packed_handle>>;
  { p.allocate_n(k, out, true) } -> std::same_as<expected<void>>;
  { p.free(h) } noexcept -> std::same_as<expected<void>>;
  { cp.kind_of(h) } noexcept -> std::same_as<expected<pool_kind>>;
  { cp.resolve(h) } noexcept -> std::same_as<expected<std::byte*>>;
  { cp.stats(k) } noexcept -> std::same_as<pool_stats>;
  { cp.reserved_bytes() } noexcept -> std::convertible_to<std::uint64_t>;
  { cp.counters() } noexcept -> std::same_as<const rebalance_counters&>;
};

namespace detail {
/// Even pool tags 2..252, one per pool object (its second table, if any, uses tag + 1), so
/// that a handle of another pool is told apart by its tag (up to 126 live pools).
inline std::uint32_t next_pool_tag() noexcept {
  static std::atomic<std::uint32_t> counter{0};
  return 2 + 2 * (counter.fetch_add(1, std::memory_order_relaxed) % 126);
}
}  // namespace detail

}  // namespace hybridcache::memory
