// hybridcache/stores/detail/hit_table.hpp
//
// The outstanding lower-tier hits of a `tiered_state_store`: one slot per hit with the
// lower-tier entries it pinned and those `load` staged for it. A ticket is (serial << 16) | slot, so a
// finished hit's ticket is stale (its slot's serial moved on) and lookup by ticket is O(1).
// Slots are reused; the table grows only with the most hits ever outstanding at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/stores/tiered_state_types.hpp"

namespace hybridcache::stores::detail {

/// A lower-tier entry a hit pinned, and the tier of the copy it pinned.
struct pinned_source {
  entry_id id = no_entry;
  tier_id tier = hbm_tier;
  /// KV: the input follows the entry's tokens up to this position (its end, or a position
  /// inside it where the input leaves it): only tokens before it are loaded.
  std::int64_t reach = 0;
};

/// One outstanding hit.
struct outstanding_hit {
  std::uint64_t ticket = 0;          ///< 0: the slot is free
  std::vector<pinned_source> pinned; ///< lower-tier entries it reads (until `load` copied them)
  std::vector<staged_entry> staged;  ///< what `load` staged for it (its holds)
  std::int64_t covered = 0;          ///< HBM holds KV for [0, covered) of the input
  std::int64_t best = 0;             ///< the hit resumes at `best` (its checkpoint's position)
};

/// Slots of outstanding hits. acquire O(1) amortised (allocates only when the table or a
/// slot's pin list grows); find / release O(1), noexcept.
class hit_table {
 public:
  /// A free slot with a fresh ticket and room for `pins` pins. @throws bad_alloc, or
  /// capacity_error at 65,535 outstanding hits, with nothing changed.
  outstanding_hit& acquire(std::size_t pins) {
    HYBRIDCACHE_EXPECTS(!free_.empty() || slots_.size() < 0xffff, capacity_error,
                        "tiered_state_store: too many outstanding hits");
    if (free_.empty()) {
      slots_.reserve(slots_.size() + 1);
      free_.reserve(slots_.size() + 1);  // release (noexcept) never allocates
      slots_.emplace_back();
      free_.push_back(static_cast<std::uint32_t>(slots_.size() - 1));
    }
    outstanding_hit& hit = slots_[free_.back()];
    hit.pinned.reserve(pins);
    free_.pop_back();
    hit.ticket = (++serial_ << 16) | static_cast<std::uint64_t>(&hit - slots_.data());
    return hit;
  }

  /// The hit of `ticket`, or nullptr (0, stale, or never issued).
  [[nodiscard]] outstanding_hit* find(std::uint64_t ticket) noexcept {
    const std::size_t slot = ticket & 0xffffu;
    return ticket != 0 && slot < slots_.size() && slots_[slot].ticket == ticket ? &slots_[slot] : nullptr;
  }
  [[nodiscard]] const outstanding_hit* find(std::uint64_t ticket) const noexcept {
    return const_cast<hit_table*>(this)->find(ticket);
  }

  /// Frees `hit`'s slot (the caller has unpinned its entries); its ticket becomes stale.
  void release(outstanding_hit& hit) noexcept {
    hit.pinned.clear();
    hit.staged.clear();
    hit.covered = hit.best = 0;
    hit.ticket = 0;
    free_.push_back(static_cast<std::uint32_t>(&hit - slots_.data()));
  }

  [[nodiscard]] std::size_t outstanding() const noexcept { return slots_.size() - free_.size(); }

 private:
  std::vector<outstanding_hit> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t serial_ = 0;
};

}  // namespace hybridcache::stores::detail
