// hybridcache/memory/stores.hpp
//
// Physical stores: `kv_pages_store<Backing>` and `ssm_blocks_store<Backing>`, one pool's
// units over a chunked address range (chunk_region.hpp) backed by a `memory_backing`.
//
// A store maps and unmaps whole physical chunks of the shared arena; the pool above it
// decides when (rebalancing) and keeps the handles. Unit addresses are
// slot_base(slot) + offset, 128 B aligned when the backing's chunks are.
//
// Costs: acquire, release, address, map_chunk, unmap_chunk O(1) (+ the backing's map /
// unmap, a driver call on CUDA VMM).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "hybridcache/concepts/physical_store.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/memory/backing.hpp"
#include "hybridcache/memory/chunk_region.hpp"
#include "hybridcache/memory/units.hpp"

namespace hybridcache::memory {

/// One pool's units over physical chunks of a shared arena.
template <pool_kind Kind, memory_backing Backing>
class paged_store {
 public:
  using backing_type = Backing;
  using arena_type = typename Backing::arena;
  using region_type = chunk_region;
  static constexpr pool_kind kind = Kind;
  static constexpr bool nothrow_mapping = nothrow_backing_v<Backing>;

  /// A store of `unit_bytes` units that can hold up to `max_slots` chunks of `arena`.
  /// @throws invalid_argument if the unit is zero, not 128 B aligned or larger than a chunk.
  paged_store(arena_type& arena, byte_count unit_bytes, std::uint32_t max_slots)
      : region_(checked_unit(unit_bytes), arena.chunk_bytes(), max_slots), view_(arena, max_slots) {}

  paged_store(const paged_store&) = delete;
  paged_store& operator=(const paged_store&) = delete;

  /// A free unit, or errc::out_of_capacity. O(1).
  [[nodiscard]] expected<std::uint32_t> acquire() noexcept { return region_.acquire(); }
  /// Gives `unit` back. O(1). Precondition: live.
  void release(std::uint32_t unit) noexcept { region_.release(unit); }
  /// Where unit `unit` lives (null for counting backings). O(1).
  [[nodiscard]] std::byte* address(std::uint32_t unit) const noexcept {
    std::byte* base = view_.slot_base(region_.slot_of(unit));
    return base ? base + region_.offset_in_chunk(unit) : nullptr;
  }

  /// Maps physical chunk `chunk` at the next free slot; returns the slot.
  /// Precondition: can_map(). Throws only what the backing's map throws (cuda_error).
  std::uint32_t map_chunk(std::uint32_t chunk) noexcept(nothrow_mapping) {
    view_.map(region_.next_slot(), chunk);  // first, so a failed driver call changes nothing
    return region_.map(chunk);
  }
  /// Unmaps the fully free chunk in `slot`; returns the physical chunk.
  std::uint32_t unmap_chunk(std::uint32_t slot) noexcept(nothrow_mapping) {
    view_.unmap(slot);
    return region_.unmap(slot);
  }
  [[nodiscard]] bool can_map() const noexcept { return region_.next_slot() != chunk_region::npos; }

  /// Copies one unit's bytes (compaction).
  void copy_unit(std::uint32_t dst, std::uint32_t src) noexcept(nothrow_mapping) {
    view_.copy(address(dst), address(src), region_.unit_bytes());
  }

  [[nodiscard]] const chunk_region& region() const noexcept { return region_; }
  [[nodiscard]] chunk_region& region() noexcept { return region_; }
  [[nodiscard]] std::uint64_t unit_bytes() const noexcept { return region_.unit_bytes(); }
  [[nodiscard]] std::uint64_t capacity_units() const noexcept { return region_.capacity_units(); }
  [[nodiscard]] std::uint64_t used_units() const noexcept { return region_.used_units(); }
  [[nodiscard]] std::uint64_t free_units() const noexcept { return region_.free_units(); }
  [[nodiscard]] const typename Backing::view& view() const noexcept { return view_; }

 private:
  static std::uint64_t checked_unit(byte_count unit_bytes) {
    HYBRIDCACHE_EXPECTS(unit_bytes > 0 && unit_bytes % unit_alignment == 0, invalid_argument,
                        "paged_store: " + std::string(to_string(Kind)) + " unit must be a positive multiple of 128 B, got " +
                            std::to_string(unit_bytes));
    return static_cast<std::uint64_t>(unit_bytes);
  }

  chunk_region region_;
  typename Backing::view view_;
};

/// KV pages: tokens_per_page x KV bytes per token of the layers a page serves, 128 B aligned.
template <memory_backing Backing>
using kv_pages_store = paged_store<pool_kind::kv, Backing>;

/// SSM blocks: the exact recurrent state of one layer of one sequence, 128 B aligned.
template <memory_backing Backing>
using ssm_blocks_store = paged_store<pool_kind::ssm, Backing>;

static_assert(physical_store<kv_pages_store<counting_backing>>);
static_assert(physical_store<ssm_blocks_store<host_backing>>);

}  // namespace hybridcache::memory
