// hybridcache/concepts/tier_entry.hpp
//
// One row of CaR's cache table: NodeID, Addr, Size, Valid_in_GPU, Score (papers/003
// §III-B1), generalised to an entry that may have a copy in several tiers at once: a clean
// replica in a lower tier lets the HBM copy be dropped without a copy (write-through), and
// a copy in flight leaves its source readable (a hit on an entry being offloaded is not
// lost). Each copy has its own state, pins and pages; the row adds what the demotion
// scorers read (recency, score, the token span of the node).
//
// The address is not a raw pointer: a copy owns runs of page indices in its tier (pages
// need not be adjacent; the copy engine coalesces adjacent runs into large transfers).
// `address()` turns the first page into a byte offset in the tier's arena, so the same
// table drives a counting simulator, host buffers and device memory.
//
// These are the vocabulary of the tiered seams (concepts/demotion.hpp, copy_engine.hpp):
// the tier id, a copy's state (its transitions: tiered/page_state.hpp) and the row.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/page_runs.hpp"

namespace hybridcache {

/// Strongly typed tier index (0 = HBM). Never converted implicitly from an integer, so a
/// tier cannot be swapped with a node id or a page count by argument order.
struct tier_id {
  std::uint8_t value = 0;
  friend constexpr bool operator==(tier_id, tier_id) = default;
  friend constexpr auto operator<=>(tier_id, tier_id) = default;
};

/// The HBM tier.
inline constexpr tier_id hbm_tier{0};

/// State of one copy of an entry in one tier (transitions: tiered/page_state.hpp).
enum class copy_state : std::uint8_t {
  valid,    ///< holds the entry's bytes: readable, may be pinned, copied from or dropped
  filling,  ///< destination of a copy in flight: invisible until the copy completes
  writing,  ///< inserted, bytes still being produced by its request: invisible until published
};

/// Ordering key of an evictable copy: smaller leaves first; `secondary` breaks ties.
struct demotion_key {
  double primary = 0.0;
  double secondary = 0.0;
  friend constexpr auto operator<=>(const demotion_key&, const demotion_key&) = default;
};

/// What the caller tells the store about a node when inserting it. Read by scorers.
struct node_info {
  std::int64_t prefix_begin = 0;  ///< tokens before the node (its parent's prefix length)
  std::int64_t prefix_end = 0;    ///< tokens up to and including the node
  bool has_checkpoint = false;    ///< the node carries a recurrent-state checkpoint
};

/// One copy of an entry: its tier, state, users and pages (in the entry's logical order).
struct tier_copy {
  tier_id tier = hbm_tier;
  copy_state state = copy_state::valid;
  std::int32_t pins = 0;     ///< requests reading it now: it cannot be dropped
  std::int32_t readers = 0;  ///< copies in flight that read it: it cannot be dropped or re-paged
  std::int64_t bytes = 0;    ///< bytes it holds (fewer than the entry's when sparsified)
  page_list pages{};         ///< pages in its tier, logical order
  std::uint64_t seq = 0;     ///< while filling: the sequence number its ticket carries
  demotion_key indexed_key{};///< key under which its tier indexes it (when idle)

  /// Droppable and evictable: valid, no pin, no copy reading it.
  [[nodiscard]] bool idle() const noexcept { return state == copy_state::valid && pins == 0 && readers == 0; }
};

/// A cache-table row: an entry and its copies, at most one per tier, fastest tier first.
/// Owned by `tiered_store`; callers see copies (`find`).
///
/// An entry's bytes are laid out layer-major: `segments` equal segments, one per layer
/// (KV of one attention layer for every token of the entry, or the state of one recurrent
/// layer), so a load can go layer by layer and a split at a token re-partitions the page
/// lists of every segment without copying.
struct cache_entry {
  entry_id id{};
  node_info info;                     ///< token span, for FLOP-aware scoring
  double score = 0.0;                 ///< CaR's Score
  std::uint64_t last_access = 0;      ///< logical time of the last touch (a promotion touches)
  std::int32_t segments = 1;          ///< layer segments of the logical order
  std::vector<tier_copy> copies{};    ///< ascending tier

  /// The copy in tier `t`, or nullptr.
  [[nodiscard]] const tier_copy* in(tier_id t) const noexcept {
    for (const auto& c : copies)
      if (c.tier == t) return &c;
    return nullptr;
  }
  /// The fastest valid copy (where a reader reads), or nullptr while none is valid.
  [[nodiscard]] const tier_copy* home() const noexcept {
    for (const auto& c : copies)
      if (c.state == copy_state::valid) return &c;
    return nullptr;
  }
  /// The home tier (the first copy's while none is valid).
  [[nodiscard]] tier_id tier() const noexcept {
    const tier_copy* h = home();
    return h != nullptr ? h->tier : copies.empty() ? hbm_tier : copies.front().tier;
  }
  /// Bytes of the home copy.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    const tier_copy* h = home();
    return h != nullptr ? h->bytes : copies.empty() ? 0 : copies.front().bytes;
  }
  /// CaR's Valid_in_GPU: a valid copy is in HBM.
  [[nodiscard]] bool valid_in_gpu() const noexcept {
    const tier_copy* c = in(hbm_tier);
    return c != nullptr && c->state == copy_state::valid;
  }
  /// A valid copy in a tier below `t` exists: the copy in `t` is clean (dropping it loses nothing).
  [[nodiscard]] bool clean_below(tier_id t) const noexcept {
    for (const auto& c : copies)
      if (c.tier > t && c.state == copy_state::valid) return true;
    return false;
  }
  /// CaR's Addr: byte offset of the home copy's first page in its tier's arena.
  [[nodiscard]] std::int64_t address(std::int64_t page_bytes) const noexcept {
    const tier_copy* h = home();
    return h == nullptr || h->pages.empty() ? -1 : static_cast<std::int64_t>(h->pages.page(0)) * page_bytes;
  }
};

}  // namespace hybridcache
