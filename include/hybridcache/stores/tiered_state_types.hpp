// hybridcache/stores/tiered_state_types.hpp
//
// The plain types a runtime exchanges with `tiered_state_store` (tiered_state_store.hpp):
// its sizes (`tiered_state_store_config`), what `lookup` found over both tiers
// (`tiered_hit`), what `load` staged (`staged_entry`) and its counters. Aggregates; kept
// apart so that code that only configures a store or reads its counters does not compile
// the store.
#pragma once

#include <cstdint>
#include <utility>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::tiered {

/// Sizes of a `tiered_state_store`.
struct tiered_state_store_config {
  std::int64_t hbm_bytes = 0;           ///< the prefix cache's byte budget (HBM tier)
  std::int64_t host_bytes = 0;          ///< host tier (demotion target)
  std::int64_t kv_bytes_per_token = 0;  ///< cost_model::kv_bytes_per_token()
  std::int64_t checkpoint_bytes = 0;    ///< cost_model::ssm_checkpoint_bytes()
  double link_gbps = 50.0;              ///< host <-> HBM link (tier_config::link_gbps)
  /// HBM room for host entries `load` brings back before prefill, beyond the cache's
  /// budget (`hbm_bytes`). 0: `load` is unavailable (the runtime loads on its own).
  std::int64_t staging_bytes = 0;
};

/// KV of a run of tokens: its entry in the tiered store (`no_entry` = empty) and its length.
/// Move-only; a moved-from handle is empty, so a handle is freed at most once.
struct tiered_kv_extent {
  entry_id id = no_entry;
  std::int64_t tokens = 0;
  tiered_kv_extent() = default;
  tiered_kv_extent(entry_id i, std::int64_t t) noexcept : id(i), tokens(t) {}
  tiered_kv_extent(tiered_kv_extent&& o) noexcept : id(std::exchange(o.id, no_entry)), tokens(std::exchange(o.tokens, 0)) {}
  tiered_kv_extent& operator=(tiered_kv_extent&& o) noexcept {
    id = std::exchange(o.id, no_entry);
    tokens = std::exchange(o.tokens, 0);
    return *this;
  }
  tiered_kv_extent(const tiered_kv_extent&) = delete;
  tiered_kv_extent& operator=(const tiered_kv_extent&) = delete;
};
/// An SSM checkpoint: its entry in the tiered store (`no_entry` = empty). Move-only.
struct tiered_checkpoint_handle {
  entry_id id = no_entry;
  tiered_checkpoint_handle() = default;
  explicit tiered_checkpoint_handle(entry_id i) noexcept : id(i) {}
  tiered_checkpoint_handle(tiered_checkpoint_handle&& o) noexcept : id(std::exchange(o.id, no_entry)) {}
  tiered_checkpoint_handle& operator=(tiered_checkpoint_handle&& o) noexcept {
    id = std::exchange(o.id, no_entry);
    return *this;
  }
  tiered_checkpoint_handle(const tiered_checkpoint_handle&) = delete;
  tiered_checkpoint_handle& operator=(const tiered_checkpoint_handle&) = delete;
};

/// One host entry `load` brought into the HBM staging room: its tokens [begin, end) of the
/// input, and its entry in `table()` (pages in the HBM arena). `checkpoint`: the recurrent
/// state at `end` rather than KV.
struct staged_entry {
  entry_id id = no_entry;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool checkpoint = false;
};

/// What `lookup` found for one input, over both tiers.
struct tiered_hit {
  std::int64_t reusable_tokens = 0;  ///< prefill starts here (HBM + host hit)
  std::int64_t hbm_tokens = 0;       ///< of which reusable from HBM alone (= match_result::reusable_tokens)
  std::int64_t host_tokens = 0;      ///< reusable_tokens - hbm_tokens: needs a load from the host tier
  std::int64_t bytes_to_load = 0;    ///< host -> HBM bytes the runtime loads (KV of the loaded span + checkpoint)
  std::int64_t kv_entries = 0;       ///< host KV entries used
  bool host_checkpoint = false;      ///< the checkpoint comes from the host tier
  std::uint64_t ticket = 0;          ///< pins to hand back to `settle` / `release_hit` (0 = nothing pinned)
  prefix::cache_salt salt = std::nullopt;  ///< the match's namespace: `settle` names the path's entries in it
};

/// Counters of a `tiered_state_store` (bytes are logical: tokens x bytes per token).
struct tiered_state_counters {
  std::int64_t demoted_entries = 0, demoted_bytes = 0;      ///< HBM -> host on eviction
  std::int64_t dropped_entries = 0, dropped_bytes = 0;      ///< named entries lost (host full / host victims)
  std::int64_t promoted_entries = 0, promoted_bytes = 0;    ///< host entries superseded by an HBM copy
  std::int64_t host_hits = 0, host_hit_tokens = 0, loaded_bytes = 0;
  std::int64_t staged_entries = 0, staged_bytes = 0;  ///< copied host -> HBM by `load`
  std::int64_t adopted_entries = 0;                   ///< staged entries whose pages the tree took
  std::int64_t copy_failures = 0;                     ///< copies the engine reported failed
};

}  // namespace hybridcache::tiered
