// hybridcache/memory/chunk_region.hpp
//
// Host-side bookkeeping of one pool's address range, made of equal physical chunks.
//
// A region has `max_slots` chunk-sized slots of virtual space (on CUDA: one
// cuMemAddressReserve). A physical chunk (on CUDA: one cuMemCreate of the allocation
// granularity, 2 MiB) can be mapped into any free slot and unmapped once it is fully
// free; that is how capacity moves between the KV and SSM pools without copying and
// without reserving memory twice. A mapped chunk holds `units_per_chunk` units; unit u
// lives in slot u / units_per_chunk at byte offset (u % units_per_chunk) * unit_bytes.
//
// Placement keeps chunks emptiable: a new unit goes into the fullest chunk that still has
// room, so free space collects in whole chunks that can be donated. Chunks sit in buckets
// by fill level (exact for up to 63 units per chunk, quantized to 64 levels above that,
// where "empty" and "full" stay exact), with a 64-bit mask of non-empty buckets, so
// picking the fullest non-full chunk, an empty chunk to donate, or the sparsest chunk
// to compact is a bit scan. Within a chunk, free units form an intrusive LIFO list.
//
// This class is pure logic (no memory, no CUDA), shared by every backing, so the chunk
// policy is tested on any machine. Costs: acquire, release, map, unmap, emptiest and
// sparsest chunk O(1); construction O(max_slots * units_per_chunk).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::memory {

class chunk_region {
 public:
  static constexpr std::uint32_t npos = 0xffffffffu;

  /// A region of `max_slots` slots of `chunk_bytes`, holding units of `unit_bytes`.
  /// @throws invalid_argument if a size is zero, the unit does not fit in a chunk, or the
  /// region would have 2^32 units or more.
  chunk_region(std::uint64_t unit_bytes, std::uint64_t chunk_bytes, std::uint32_t max_slots)
      : unit_bytes_(unit_bytes), chunk_bytes_(chunk_bytes), max_slots_(max_slots) {
    HYBRIDCACHE_EXPECTS(unit_bytes > 0, invalid_argument, "chunk_region: unit size must be > 0 bytes");
    HYBRIDCACHE_EXPECTS(chunk_bytes >= unit_bytes, invalid_argument,
                        "chunk_region: a unit of " + std::to_string(unit_bytes) +
                            " B does not fit in a chunk of " + std::to_string(chunk_bytes) + " B");
    const std::uint64_t upc = chunk_bytes / unit_bytes;
    HYBRIDCACHE_EXPECTS(upc * max_slots < npos, invalid_argument,
                        "chunk_region: more than 2^32 - 1 units in one region");
    upc_ = static_cast<std::uint32_t>(upc);
    buckets_ = upc_ + 1 <= 64 ? upc_ + 1 : 64;
    full_bucket_ = buckets_ - 1;
    chunks_.resize(max_slots);
    next_free_unit_.assign(static_cast<std::size_t>(upc_) * max_slots, npos);
    live_.assign(static_cast<std::size_t>(upc_) * max_slots, 0);
    head_.assign(buckets_, npos);
    free_slots_.reserve(max_slots);
    for (std::uint32_t s = max_slots; s-- > 0;) free_slots_.push_back(s);  // lowest slot first
  }

  // --- geometry -----------------------------------------------------------------------
  [[nodiscard]] std::uint64_t unit_bytes() const noexcept { return unit_bytes_; }
  [[nodiscard]] std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
  [[nodiscard]] std::uint32_t units_per_chunk() const noexcept { return upc_; }
  [[nodiscard]] std::uint32_t max_slots() const noexcept { return max_slots_; }
  /// Bytes of a chunk no unit can use (chunk_bytes mod unit_bytes).
  [[nodiscard]] std::uint64_t tail_waste_bytes() const noexcept { return chunk_bytes_ - upc_ * unit_bytes_; }
  [[nodiscard]] std::uint32_t slot_of(std::uint32_t unit) const noexcept { return unit / upc_; }
  [[nodiscard]] std::uint64_t offset_in_chunk(std::uint32_t unit) const noexcept {
    return static_cast<std::uint64_t>(unit % upc_) * unit_bytes_;
  }

  // --- occupancy ----------------------------------------------------------------------
  [[nodiscard]] std::uint32_t mapped_chunks() const noexcept { return mapped_; }
  [[nodiscard]] std::uint32_t empty_chunks() const noexcept { return empty_; }
  [[nodiscard]] std::uint64_t capacity_units() const noexcept { return std::uint64_t{mapped_} * upc_; }
  [[nodiscard]] std::uint64_t used_units() const noexcept { return used_; }
  [[nodiscard]] std::uint64_t free_units() const noexcept { return capacity_units() - used_; }
  [[nodiscard]] bool is_mapped(std::uint32_t slot) const noexcept { return slot < max_slots_ && chunks_[slot].mapped; }
  [[nodiscard]] std::uint32_t used_in(std::uint32_t slot) const noexcept { return chunks_[slot].used; }
  [[nodiscard]] std::uint32_t physical_of(std::uint32_t slot) const noexcept { return chunks_[slot].physical; }
  [[nodiscard]] bool is_live(std::uint32_t unit) const noexcept {
    return unit < live_.size() && live_[unit] != 0;
  }

  // --- units --------------------------------------------------------------------------

  /// Takes a free unit from the fullest chunk that has one. O(1).
  [[nodiscard]] expected<std::uint32_t> acquire() noexcept {
    const std::uint64_t open = mask_ & ~(std::uint64_t{1} << full_bucket_);
    if (open == 0) return unexpected(errc::out_of_capacity);
    const auto b = static_cast<std::uint32_t>(63 - std::countl_zero(open));
    return take_from(head_[b]);
  }

  /// Returns `unit` to its chunk. O(1). Precondition: is_live(unit).
  void release(std::uint32_t unit) noexcept {
    HYBRIDCACHE_ASSERT(is_live(unit));
    const std::uint32_t s = unit / upc_;
    chunk& c = chunks_[s];
    live_[unit] = 0;
    next_free_unit_[unit] = c.free_head;
    c.free_head = unit;
    const std::uint32_t before = bucket_of(c.used);
    --c.used;
    --used_;
    if (c.used == 0) ++empty_;
    if (c.draining) return;
    const std::uint32_t after = bucket_of(c.used);
    if (after != before) {
      unlink(s, before);
      link(s, after);
    }
  }

  // --- chunks -------------------------------------------------------------------------

  /// Maps physical chunk `physical` into a free slot (the most recently vacated one, else
  /// the lowest never used); returns the slot. O(1).
  /// Precondition: mapped_chunks() < max_slots().
  std::uint32_t map(std::uint32_t physical) noexcept {
    HYBRIDCACHE_ASSERT(!free_slots_.empty());
    const std::uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    chunk& c = chunks_[s];
    c.mapped = true;
    c.physical = physical;
    c.used = 0;
    c.free_head = npos;
    const std::uint32_t base = s * upc_;
    for (std::uint32_t i = upc_; i-- > 0;) {  // lowest unit first
      next_free_unit_[base + i] = c.free_head;
      c.free_head = base + i;
    }
    ++mapped_;
    ++empty_;
    link(s, 0);
    return s;
  }

  /// The next slot map() will use (npos when the region is full). O(1).
  [[nodiscard]] std::uint32_t next_slot() const noexcept {
    return free_slots_.empty() ? npos : free_slots_.back();
  }

  /// Unmaps the fully free chunk in `slot`; returns its physical chunk. O(1).
  /// Precondition: is_mapped(slot) and used_in(slot) == 0 and not draining.
  std::uint32_t unmap(std::uint32_t slot) noexcept {
    chunk& c = chunks_[slot];
    HYBRIDCACHE_ASSERT(c.mapped && c.used == 0 && !c.draining);
    unlink(slot, 0);
    c.mapped = false;
    --mapped_;
    --empty_;
    free_slots_.push_back(slot);
    return c.physical;
  }

  /// A fully free mapped chunk (the emptiest possible), or npos. O(1).
  [[nodiscard]] std::uint32_t emptiest_free_slot() const noexcept {
    return (mask_ & 1u) ? head_[0] : npos;
  }

  /// A chunk with the fewest live units among partially used ones (exact up to 63 units
  /// per chunk, within one fill level above), or npos. O(1).
  [[nodiscard]] std::uint32_t sparsest_used_slot() const noexcept {
    const std::uint64_t partial = mask_ & ~std::uint64_t{1} & ~(std::uint64_t{1} << full_bucket_);
    const std::uint64_t any = partial ? partial : (mask_ & ~std::uint64_t{1});
    if (any == 0) return npos;
    return head_[static_cast<std::uint32_t>(std::countr_zero(any))];
  }

  /// Takes the chunk in `slot` out of placement (so acquire() never picks it) while its
  /// live units are moved out. O(1).
  void begin_drain(std::uint32_t slot) noexcept {
    chunk& c = chunks_[slot];
    HYBRIDCACHE_ASSERT(c.mapped && !c.draining);
    unlink(slot, bucket_of(c.used));
    c.draining = true;
  }

  /// Puts a drained chunk back into placement. O(1).
  void end_drain(std::uint32_t slot) noexcept {
    chunk& c = chunks_[slot];
    HYBRIDCACHE_ASSERT(c.draining);
    c.draining = false;
    link(slot, bucket_of(c.used));
  }

 private:
  struct chunk {
    std::uint32_t used = 0;
    std::uint32_t free_head = npos;
    std::uint32_t prev = npos;
    std::uint32_t next = npos;
    std::uint32_t physical = npos;
    bool mapped = false;
    bool draining = false;
  };

  [[nodiscard]] std::uint32_t bucket_of(std::uint32_t used) const noexcept {
    if (upc_ + 1 <= 64) return used;
    if (used == 0) return 0;
    if (used == upc_) return 63;
    return 1 + static_cast<std::uint32_t>(static_cast<std::uint64_t>(used - 1) * 62 / (upc_ - 1));
  }

  std::uint32_t take_from(std::uint32_t s) noexcept {
    chunk& c = chunks_[s];
    HYBRIDCACHE_ASSERT(c.mapped && c.free_head != npos);
    const std::uint32_t unit = c.free_head;
    c.free_head = next_free_unit_[unit];
    live_[unit] = 1;
    if (c.used == 0) --empty_;
    const std::uint32_t before = bucket_of(c.used);
    ++c.used;
    ++used_;
    if (!c.draining) {
      const std::uint32_t after = bucket_of(c.used);
      if (after != before) {
        unlink(s, before);
        link(s, after);
      }
    }
    return unit;
  }

  void link(std::uint32_t s, std::uint32_t b) noexcept {
    chunk& c = chunks_[s];
    c.prev = npos;
    c.next = head_[b];
    if (c.next != npos) chunks_[c.next].prev = s;
    head_[b] = s;
    mask_ |= std::uint64_t{1} << b;
  }

  void unlink(std::uint32_t s, std::uint32_t b) noexcept {
    chunk& c = chunks_[s];
    if (c.prev != npos) chunks_[c.prev].next = c.next;
    else head_[b] = c.next;
    if (c.next != npos) chunks_[c.next].prev = c.prev;
    if (head_[b] == npos) mask_ &= ~(std::uint64_t{1} << b);
    c.prev = c.next = npos;
  }

  std::uint64_t unit_bytes_;
  std::uint64_t chunk_bytes_;
  std::uint32_t max_slots_;
  std::uint32_t upc_ = 0;
  std::uint32_t buckets_ = 0;
  std::uint32_t full_bucket_ = 0;
  std::uint32_t mapped_ = 0;
  std::uint32_t empty_ = 0;
  std::uint64_t used_ = 0;
  std::uint64_t mask_ = 0;
  std::vector<chunk> chunks_;
  std::vector<std::uint32_t> next_free_unit_;
  std::vector<std::uint8_t> live_;
  std::vector<std::uint32_t> head_;
  std::vector<std::uint32_t> free_slots_;
};

}  // namespace hybridcache::memory
