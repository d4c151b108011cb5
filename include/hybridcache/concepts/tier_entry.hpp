// hybridcache/concepts/tier_entry.hpp
//
// One row of CaR's cache table: NodeID, Addr, Size, Valid_in_GPU, Score (papers/003
// §III-B1), plus what the store needs to keep the row race-free (state, pin count, move
// sequence) and what the demotion scorers read (recency, the token span of the node).
//
// The address is not a raw pointer: an entry owns a list of page indices in its home tier
// (pages need not be adjacent; the copy engine coalesces adjacent runs into large
// transfers). `address()` turns the first page into a byte offset in the tier's arena, so
// the same table drives a counting simulator, host buffers and device memory.
//
// These are the vocabulary of the tiered seams (concepts/demotion.hpp, copy_engine.hpp):
// the tier id, the entry's state (its transitions: tiered/page_state.hpp) and the row.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::tiered {

/// Strongly typed tier index (0 = HBM). Never converted implicitly from an integer, so a
/// tier cannot be swapped with a node id or a page count by argument order.
struct tier_id {
  std::uint8_t value = 0;
  friend constexpr bool operator==(tier_id, tier_id) = default;
  friend constexpr auto operator<=>(tier_id, tier_id) = default;
};

/// The HBM tier.
inline constexpr tier_id hbm_tier{0};

/// State of a cache-table entry.
enum class page_state : std::uint8_t {
  resident,  ///< lives in exactly one tier, idle: may be pinned, moved or erased
  pinned,    ///< in use by at least one request: may only be pinned again or unpinned
  moving,    ///< a copy to another tier is in flight: source and destination both held
  writing,   ///< inserted, bytes still being produced: invisible to readers and movers
};


/// Ordering key of an evictable entry: smaller leaves first; `secondary` breaks ties.
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

/// A cache-table row. Owned by `tiered_store`; callers see copies (`entry_view`).
struct cache_entry {
  entry_id id{};
  tier_id tier = hbm_tier;            ///< home tier (where the bytes are valid)
  page_state state = page_state::resident;
  std::int32_t pins = 0;              ///< requests using the entry now
  std::int64_t bytes = 0;             ///< Size: bytes stored in the home tier
  std::vector<std::uint32_t> pages;   ///< page indices in the home tier, in logical order (ascending when allocated)
  double score = 0.0;                 ///< CaR's Score
  std::uint64_t last_access = 0;      ///< logical time of the last touch
  node_info info;                     ///< token span, for FLOP-aware scoring
  std::uint64_t move_seq = 0;         ///< bumped by every prepare_move; tickets carry it
  tier_id move_dst = hbm_tier;        ///< destination of the move in flight (state `moving`)
  demotion_key indexed_key{};         ///< key under which the store indexes it (when resident)

  /// CaR's Valid_in_GPU: the bytes are in HBM and usable now (not mid-copy).
  [[nodiscard]] bool valid_in_gpu() const noexcept { return tier == hbm_tier && state != page_state::moving; }
  /// CaR's Addr: byte offset of the first page in the home tier's arena.
  [[nodiscard]] std::int64_t address(std::int64_t page_bytes) const noexcept {
    return pages.empty() ? -1 : static_cast<std::int64_t>(pages.front()) * page_bytes;
  }
};

}  // namespace hybridcache::tiered
