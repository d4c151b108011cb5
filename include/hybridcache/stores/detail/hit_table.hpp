// hybridcache/stores/detail/hit_table.hpp
//
// The outstanding lower-tier hits of a store with tiers below HBM: one slot per hit with what
// it holds (a `tiered_state_store`: the lower-tier entries it pinned and those `load` staged
// for it; a `pool_state_store`: the host entries it pinned). A hit carries a ticket, not its
// holds, so it is a small copyable value and the holds keep their capacity across hits. A
// ticket is (serial << 16) | slot, so a finished hit's ticket is stale (its slot's serial
// moved on) and lookup by ticket is O(1). Slots are reused; the table grows only with the
// most hits ever outstanding at once.
#pragma once

#include <concepts>
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

/// One outstanding hit of a `tiered_state_store`.
struct outstanding_hit {
  std::vector<pinned_source> pinned; ///< lower-tier entries it reads (until `load` copied them)
  std::vector<staged_entry> staged;  ///< what `load` staged for it (its holds)
  std::int64_t covered = 0;          ///< HBM holds KV for [0, covered) of the input
  std::int64_t best = 0;             ///< the hit resumes at `best` (its checkpoint's position)

  std::uint64_t ticket = 0;          ///< 0: the slot is free (hit_table's)
  void reserve(std::size_t pins) { pinned.reserve(pins); }
  void clear() noexcept {
    pinned.clear();
    staged.clear();
    covered = best = 0;
  }
};

/// What a hit holds, as `hit_table` keeps it: a `ticket` (0 while the slot is free),
/// `reserve(n)` room for n holds (may throw), `clear()` (noexcept) forgets them.
template <class H>
concept hit_hold = std::default_initializable<H> && requires(H& h, std::size_t n) {
  { h.ticket } -> std::convertible_to<std::uint64_t>;
  h.reserve(n);
  { h.clear() } noexcept;
};

static_assert(hit_hold<outstanding_hit>);

/// Slots of outstanding hits, each holding a `Hold`. acquire O(1) amortised (allocates only
/// when the table or a slot's hold list grows); find / release O(1), noexcept.
template <hit_hold Hold>
class hit_table {
 public:
  /// A free slot with a fresh ticket and room for `holds` holds. @throws bad_alloc, or
  /// capacity_error at 65,535 outstanding hits, with nothing changed.
  Hold& acquire(std::size_t holds) {
    HYBRIDCACHE_EXPECTS(!free_.empty() || slots_.size() < 0xffff, capacity_error,
                        "hit_table: too many outstanding hits");
    if (free_.empty()) {
      slots_.reserve(slots_.size() + 1);
      free_.reserve(slots_.size() + 1);  // release (noexcept) never allocates
      slots_.emplace_back();
      free_.push_back(static_cast<std::uint32_t>(slots_.size() - 1));
    }
    Hold& hit = slots_[free_.back()];
    hit.reserve(holds);
    free_.pop_back();
    hit.ticket = (++serial_ << 16) | static_cast<std::uint64_t>(&hit - slots_.data());
    return hit;
  }

  /// The hit of `ticket`, or nullptr (0, stale, or never issued).
  [[nodiscard]] Hold* find(std::uint64_t ticket) noexcept {
    const std::size_t slot = ticket & 0xffffu;
    return ticket != 0 && slot < slots_.size() && slots_[slot].ticket == ticket ? &slots_[slot] : nullptr;
  }
  [[nodiscard]] const Hold* find(std::uint64_t ticket) const noexcept {
    return const_cast<hit_table*>(this)->find(ticket);
  }

  /// Frees `hit`'s slot (the caller has unpinned its entries); its ticket becomes stale.
  void release(Hold& hit) noexcept {
    hit.clear();
    hit.ticket = 0;
    free_.push_back(static_cast<std::uint32_t>(&hit - slots_.data()));
  }

  [[nodiscard]] std::size_t outstanding() const noexcept { return slots_.size() - free_.size(); }

 private:
  std::vector<Hold> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t serial_ = 0;
};

}  // namespace hybridcache::stores::detail
