// hybridcache/memory/pool.hpp
//
// What the pools share beyond their concept (`kv_ssm_pool`, concepts/pool.hpp, which
// asymmetric_pool, padded_unified_pool and fixed_dual_pool all model, so replay engines and
// the prefix cache's state-store adaptor take any of them): the pool-tag allocator.
#pragma once

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"
#include "hybridcache/concepts/pool.hpp"
#include "hybridcache/memory/chunk_region.hpp"
#include "hybridcache/memory/units.hpp"

namespace hybridcache::memory {

/// The occupancy of a pool that is one chunk_region: every field but `fragmentation`
/// (left 0; pools that report it compute it on top). O(1).
[[nodiscard]] inline pool_stats region_stats(const chunk_region& r) noexcept {
  pool_stats s;
  // The region counts in unsigned units internally; the API speaks byte_count / int64.
  s.unit_bytes = static_cast<byte_count>(r.unit_bytes());
  s.total_units = static_cast<std::int64_t>(r.capacity_units());
  s.used_units = static_cast<std::int64_t>(r.used_units());
  s.free_units = static_cast<std::int64_t>(r.free_units());
  s.mapped_chunks = r.mapped_chunks();
  s.empty_chunks = r.empty_chunks();
  s.free_fraction = s.total_units ? static_cast<double>(s.free_units) / static_cast<double>(s.total_units) : 0.0;
  return s;
}

namespace detail {
/// Even pool tags 2..252, one per pool object (its second table, if any, uses tag + 1), so
/// that a handle of another pool is told apart by its tag (up to 126 live pools).
inline std::uint32_t next_pool_tag() noexcept {
  static std::atomic<std::uint32_t> counter{0};
  return 2 + 2 * (counter.fetch_add(1, std::memory_order_relaxed) % 126);
}
}  // namespace detail

}  // namespace hybridcache::memory
