// hybridcache/tiered/cache_entry.hpp
//
// One row of CaR's cache table: NodeID, Addr, Size, Valid_in_GPU, Score (papers/003
// §III-B1), plus what the store needs to keep the row race-free (state, pin count, move
// sequence) and what the demotion scorers read (recency, the token span of the node).
//
// The address is not a raw pointer: an entry owns a list of page indices in its home tier
// (pages need not be adjacent; the copy engine coalesces adjacent runs into large
// transfers). `address()` turns the first page into a byte offset in the tier's arena, so
// the same table drives a counting simulator, host buffers and device memory.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "hybridcache/tiered/page_state.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::tiered {

/// Identifier of a cached node (a radix-tree node, a block hash, ...). Chosen by the caller.
using node_id = std::uint64_t;

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
  node_id id = 0;
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
