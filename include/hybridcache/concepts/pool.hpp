// hybridcache/concepts/pool.hpp
//
// `kv_ssm_pool`: a pool of KV pages and SSM blocks addressed by generation-checked handles
// (models: memory/asymmetric_pool.hpp, padded_unified_pool.hpp, fixed_dual_pool.hpp; the
// prefix cache reaches one through stores/pool_state_store.hpp), with the vocabulary it
// speaks: `pool_kind`, `pool_stats`, `rebalance_counters`.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "hybridcache/core/byte_count.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache {

/// Which of the two pools a unit lives in.
enum class pool_kind : std::uint8_t {
  kv = 0,   ///< paged attention KV cache (grows with the sequence)
  ssm = 1,  ///< fixed-size recurrent (SSM / linear attention) state blocks
};

/// The other pool.
[[nodiscard]] constexpr pool_kind other(pool_kind k) noexcept {
  return k == pool_kind::kv ? pool_kind::ssm : pool_kind::kv;
}

/// "kv" or "ssm".
[[nodiscard]] constexpr std::string_view to_string(pool_kind k) noexcept {
  return k == pool_kind::kv ? "kv" : "ssm";
}

/// Per-pool occupancy. Bytes are `byte_count`, unit counts `std::int64_t` (core/byte_count.hpp).
struct pool_stats {
  byte_count unit_bytes = 0;
  std::int64_t total_units = 0;
  std::int64_t used_units = 0;
  std::int64_t free_units = 0;
  std::uint32_t mapped_chunks = 0;
  std::uint32_t empty_chunks = 0;
  /// free / total (the reference's "fragmentation"; 0 for an empty pool).
  double free_fraction = 0;
  /// Share of the free units stranded in partly used chunks, which cannot be donated
  /// without compaction (external fragmentation at chunk granularity).
  double fragmentation = 0;
  [[nodiscard]] byte_count total_bytes() const noexcept { return total_units * unit_bytes; }
  [[nodiscard]] byte_count used_bytes() const noexcept { return used_units * unit_bytes; }
};

/// Counters of capacity movement (all zero for static pools).
struct rebalance_counters {
  std::int64_t rebalances = 0;     ///< committed migrations
  std::int64_t chunks_migrated = 0;
  byte_count bytes_migrated = 0;   ///< physical bytes remapped
  byte_count bytes_wasted = 0;     ///< migrated bytes the recipient's unit size cannot use
  std::int64_t refused = 0;        ///< plans refused by the rebalancer or with nothing to move
  std::int64_t rollbacks = 0;      ///< migrations undone because the recipient failed
  std::int64_t compactions = 0;    ///< chunks emptied by moving live units
  std::int64_t units_moved = 0;    ///< live units copied by compaction
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
  { cp.reserved_bytes() } noexcept -> std::same_as<byte_count>;
  { cp.counters() } noexcept -> std::same_as<const rebalance_counters&>;
};

/// A `kv_ssm_pool` whose capacity can move between its two sides (asymmetric_pool): the
/// pool store uses these to refuse a request that could never be placed and to move free
/// chunks to a short side before anything is evicted.
/// - `max_units(k)`: the most units of `k` the pool could ever map. O(1).
/// - `could_place_when_empty(kv, ssm)`: whether `kv` pages and `ssm` blocks fit at once once
///   every unit is free. O(1).
/// - `rebalance_on_failure(k, units)`: asks the rebalancer for `units` more of `k` (free
///   chunks of the other side move over; no live unit moves); returns the chunks moved.
template <class P>
concept rebalancing_pool = kv_ssm_pool<P> && requires(P& p, const P& cp, pool_kind k, std::int64_t n) {
  { cp.max_units(k) } noexcept -> std::same_as<std::int64_t>;
  { cp.could_place_when_empty(n, n) } noexcept -> std::same_as<bool>;
  { p.rebalance_on_failure(k, n) } -> std::convertible_to<std::uint32_t>;
};

}  // namespace hybridcache
