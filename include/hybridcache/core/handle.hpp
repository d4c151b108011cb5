// hybridcache/core/handle.hpp
//
// Opaque generation-checked handles, and the O(1) slot table that issues them.
//
// A `packed_handle` is 64 bits: an 8-bit pool tag (which pool/table issued it), a 24-bit
// generation and a 32-bit slot index. Each slot's generation is bumped when the slot is
// freed, so a handle kept past its free no longer matches: stale handles and double
// frees are detected instead of silently corrupting state (the AVMP reference ignores
// both). A generation wraps after 2^24 reuses of one slot; wrapping skips generation 0 so
// that the null handle (all zero bits) is never valid.
//
// `generation_table` costs: acquire O(1), release O(1), validate O(1); no allocation
// after construction (capacity is fixed up front, or grown explicitly with `reserve`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache {

/// 64-bit opaque handle: pool tag (8 bits) | generation (24 bits) | index (32 bits).
/// Trivially copyable; usable on host and device. The all-zero value is the null handle.
class packed_handle {
 public:
  static constexpr std::uint32_t generation_bits = 24;
  static constexpr std::uint32_t generation_mask = (1u << generation_bits) - 1;
  static constexpr std::uint32_t max_tag = 255;

  constexpr packed_handle() noexcept = default;

  HYBRIDCACHE_HD_INLINE static constexpr packed_handle make(std::uint32_t pool_tag,
                                                            std::uint32_t index,
                                                            std::uint32_t generation) noexcept {
    packed_handle h;
    h.bits_ = (static_cast<std::uint64_t>(pool_tag & 0xffu) << 56) |
              (static_cast<std::uint64_t>(generation & generation_mask) << 32) |
              static_cast<std::uint64_t>(index);
    return h;
  }
  HYBRIDCACHE_HD_INLINE static constexpr packed_handle from_bits(std::uint64_t bits) noexcept {
    packed_handle h;
    h.bits_ = bits;
    return h;
  }

  HYBRIDCACHE_HD_INLINE constexpr std::uint32_t pool_tag() const noexcept {
    return static_cast<std::uint32_t>(bits_ >> 56);
  }
  HYBRIDCACHE_HD_INLINE constexpr std::uint32_t generation() const noexcept {
    return static_cast<std::uint32_t>(bits_ >> 32) & generation_mask;
  }
  HYBRIDCACHE_HD_INLINE constexpr std::uint32_t index() const noexcept {
    return static_cast<std::uint32_t>(bits_);
  }
  HYBRIDCACHE_HD_INLINE constexpr std::uint64_t bits() const noexcept { return bits_; }
  HYBRIDCACHE_HD_INLINE constexpr bool is_null() const noexcept { return bits_ == 0; }

  friend constexpr bool operator==(packed_handle, packed_handle) noexcept = default;

 private:
  std::uint64_t bits_ = 0;
};

/// Issues and checks `packed_handle`s for a fixed set of slots [0, capacity).
///
/// Free slots are kept on an intrusive LIFO list (the most recently freed slot is reused
/// first, which keeps hot memory hot). Every operation is O(1) and allocation-free.
class generation_table {
 public:
  /// @throws invalid_argument if `pool_tag` > 255 or capacity >= 2^32.
  explicit generation_table(std::uint32_t pool_tag, std::uint64_t capacity = 0)
      : tag_(pool_tag) {
    HYBRIDCACHE_EXPECTS(pool_tag <= packed_handle::max_tag, invalid_argument,
                        "generation_table: pool_tag must be <= 255, got " + std::to_string(pool_tag));
    reserve(capacity);
  }

  /// Grows the table to `capacity` slots (never shrinks). Allocates; not for hot paths.
  /// @throws invalid_argument if capacity >= 2^32.
  void reserve(std::uint64_t capacity) {
    HYBRIDCACHE_EXPECTS(capacity < (std::uint64_t{1} << 32), invalid_argument,
                        "generation_table: capacity must be < 2^32");
    if (capacity <= slots_.size()) return;
    const auto old = static_cast<std::uint32_t>(slots_.size());
    slots_.resize(capacity);
    // Push new slots so that the lowest index is handed out first.
    for (auto i = static_cast<std::uint32_t>(capacity); i-- > old;) {
      slots_[i].generation = 1;
      slots_[i].live = false;
      slots_[i].next_free = free_head_;
      free_head_ = i;
    }
    free_count_ += static_cast<std::uint32_t>(capacity - old);
  }

  /// Takes a free slot. O(1). Returns errc::out_of_capacity when none is free.
  [[nodiscard]] expected<packed_handle> acquire() noexcept {
    if (free_head_ == npos) return unexpected(errc::out_of_capacity);
    const std::uint32_t i = free_head_;
    slot& s = slots_[i];
    free_head_ = s.next_free;
    s.live = true;
    --free_count_;
    return packed_handle::make(tag_, i, s.generation);
  }

  /// Checks that `h` names a live slot of this table. O(1).
  [[nodiscard]] errc validate(packed_handle h) const noexcept {
    if (h.pool_tag() != tag_ || h.index() >= slots_.size()) return errc::foreign_handle;
    const slot& s = slots_[h.index()];
    if (s.generation == h.generation()) return s.live ? errc::ok : errc::double_free;
    // The slot's last holder freed it and nobody took it since: freeing again is a double
    // free. Any other mismatch is a handle kept past its slot's reuse.
    if (!s.live && next_generation(h.generation()) == s.generation) return errc::double_free;
    return errc::stale_handle;
  }

  /// Frees the slot of `h`; the slot's generation moves on so `h` becomes stale. O(1).
  /// A stale, double-freed or foreign handle is reported and changes nothing.
  [[nodiscard]] expected<void> release(packed_handle h) noexcept {
    const errc e = validate(h);
    if (e != errc::ok) return unexpected(e);
    slot& s = slots_[h.index()];
    s.live = false;
    s.generation = next_generation(s.generation);
    s.next_free = free_head_;
    free_head_ = h.index();
    ++free_count_;
    return {};
  }

  /// Frees the live slot of `h` as `release` does, but so that `h` reads stale_handle from
  /// now on, not double_free: for a handle invalidated by its owner (a cache cleared under
  /// a request in flight) rather than freed by its holder. O(1).
  [[nodiscard]] expected<void> retire(packed_handle h) noexcept {
    const errc e = validate(h);
    if (e != errc::ok) return unexpected(e);
    slot& s = slots_[h.index()];
    s.live = false;
    s.generation = next_generation(next_generation(s.generation));
    s.next_free = free_head_;
    free_head_ = h.index();
    ++free_count_;
    return {};
  }

  /// Frees every live slot; each one's handle reads stale_handle from now on (as after
  /// `retire`: the owner invalidated it, its holder did not free it). O(capacity), no
  /// allocation.
  void release_all() noexcept {
    for (std::uint32_t i = 0; i < slots_.size(); ++i) {
      slot& s = slots_[i];
      if (!s.live) continue;
      s.live = false;
      s.generation = next_generation(next_generation(s.generation));
      s.next_free = free_head_;
      free_head_ = i;
      ++free_count_;
    }
  }

  [[nodiscard]] std::uint32_t pool_tag() const noexcept { return tag_; }
  [[nodiscard]] std::uint64_t capacity() const noexcept { return slots_.size(); }
  /// Heap bytes of the slot array (its capacity). O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    return static_cast<std::int64_t>(slots_.capacity() * sizeof(slot));
  }
  [[nodiscard]] std::uint64_t free_count() const noexcept { return free_count_; }
  [[nodiscard]] std::uint64_t live_count() const noexcept { return slots_.size() - free_count_; }
  /// True if slot `index` is live (for iteration and tests).
  [[nodiscard]] bool is_live(std::uint32_t index) const noexcept {
    return index < slots_.size() && slots_[index].live;
  }

 private:
  static constexpr std::uint32_t npos = 0xffffffffu;
  static constexpr std::uint32_t next_generation(std::uint32_t g) noexcept {
    const std::uint32_t n = (g + 1) & packed_handle::generation_mask;
    return n == 0 ? 1 : n;  // 0 is reserved so the null handle never validates
  }

  struct slot {
    std::uint32_t generation = 1;
    std::uint32_t next_free = npos;
    bool live = false;
  };

  std::uint32_t tag_;
  std::vector<slot> slots_;
  std::uint32_t free_head_ = npos;
  std::uint64_t free_count_ = 0;
};

}  // namespace hybridcache
