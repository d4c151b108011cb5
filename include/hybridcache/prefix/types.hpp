// hybridcache/prefix/types.hpp
//
// Vocabulary types of the hybrid prefix cache (ids: concepts/ids.hpp; `match_result`, which
// the store seams take too: concepts/match_result.hpp): the plain result structs that
// `prefix_cache` hands back per call (what a replay engine records per request). All are aggregates, trivially copyable except `checkpoint_plan`, and cost
// nothing to return.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/match_result.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache::prefix {

namespace detail {
/// Reserves room for `n` elements, growing capacity at least geometrically so that calls
/// with slowly increasing `n` cost O(1) amortised (a plain reserve(n) would reallocate and
/// move everything on every call).
template <class Vector>
void reserve_geometric(Vector& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
}

/// Grows every per-node array to `n` slots (new slots value-initialised), geometrically, so
/// that a scorer's reserve costs O(1) amortised per node.
template <class... Vectors>
void grow_all(std::size_t n, Vectors&... v) {
  (reserve_geometric(v, n), ...);
  (v.resize(n), ...);
}
}  // namespace detail

/// Where prefill must save an SSM state so that `commit` can admit it.
///
/// A chunked scan (Mamba-2 SSD, GDN chunkwise) materialises states only at multiples of
/// its chunk size C. For a wanted position p (the state after token p, 1-based count of
/// tokens), prefill saves the state at `chunk_boundary` = the largest multiple of C that is
/// <= p (or the prefill start, if later) and rolls forward `roll_forward = p -
/// chunk_boundary` tokens with the recurrent form (Marconi §4.2). Two-pass prefill instead
/// splits the prefill at p.
struct checkpoint_site {
  std::int64_t position = 0;        ///< tokens before the state (1..sequence length)
  std::int64_t chunk_boundary = 0;  ///< state materialised by the chunked scan
  std::int64_t roll_forward = 0;    ///< tokens stepped recurrently from there (< C)
};

/// Output of `prefix_cache::plan`: the checkpoint sites of one request, ascending.
struct checkpoint_plan {
  std::int64_t prefill_start = 0;      ///< = match.reusable_tokens
  std::int64_t chunk = 0;              ///< scan chunk size C used
  std::vector<checkpoint_site> sites;  ///< ascending positions, all > prefill_start
  /// Split points for a two-pass prefill (the same positions, for engines without
  /// chunk-boundary state output): prefill [prefill_start, p1), [p1, p2), ...
  [[nodiscard]] std::vector<std::int64_t> two_pass_splits() const {
    std::vector<std::int64_t> out;
    out.reserve(sites.size());
    for (const auto& s : sites) out.push_back(s.position);
    return out;
  }
};

/// What left the cache in one eviction step, as `prefix_cache` tells an eviction listener
/// before it frees the handles (so a runtime can drop its own references to those pages).
struct eviction_event {
  node_id node = no_node;            ///< the victim (its id may be reused afterwards)
  std::int64_t begin = 0;            ///< the victim's tokens are [begin, end) of its path
  std::int64_t end = 0;
  bool checkpoint_freed = false;     ///< the state after token `end` left the cache
  bool kv_freed = false;             ///< the KV of [begin, end) left (a removed leaf)
  bool kv_moved_to_child = false;    ///< the KV of [begin, end) now belongs to the only child (merge)
};

/// A plain callback (no allocation, no type erasure on the hot path): `fn(context, event)`
/// for every eviction step, called under the cache's lock before the handles are freed.
/// It must not call back into the cache.
struct eviction_listener {
  void (*fn)(void* context, const eviction_event& event) noexcept = nullptr;
  void* context = nullptr;
};

/// What one `prefix_cache::commit` did (a replay engine sums these per run).
struct commit_result {
  std::int64_t sequence_tokens = 0;       ///< length of the committed sequence
  std::int64_t new_tokens = 0;            ///< tokens whose KV was admitted (not already cached)
  std::int64_t kv_bytes_admitted = 0;     ///< store bytes of those tokens' KV
  std::int64_t checkpoints_admitted = 0;  ///< SSM checkpoints added (at most 2 for judicious)
  std::int64_t checkpoint_bytes_admitted = 0;
  std::int64_t evictions = 0;             ///< eviction actions taken to make room
  std::int64_t nodes_removed = 0;         ///< nodes deleted (leaves, merged parents)
  std::int64_t checkpoints_evicted = 0;   ///< SSM checkpoints dropped by eviction
  std::int64_t bytes_evicted = 0;         ///< store bytes freed by eviction
  bool over_capacity = false;             ///< store above capacity after commit (only with admit_oversized and a store that allows overflow)
  double alpha = 0.0;                     ///< scorer's alpha after this commit (0 for LRU)
};

/// Running totals a cache keeps (all monotone counters; O(1) to read).
struct cache_counters {
  std::int64_t matches = 0;
  std::int64_t hits = 0;
  std::int64_t tokens_matched = 0;       ///< Σ input tokens of matches
  std::int64_t tokens_skipped = 0;       ///< Σ reusable tokens
  std::int64_t flops_saved = 0;          ///< Σ hit FLOPs (saturating at int64 max)
  std::int64_t commits = 0;
  std::int64_t checkpoints_admitted = 0;
  std::int64_t checkpoints_reused = 0;
  std::int64_t checkpoints_evicted = 0;
  std::int64_t kv_bytes_admitted = 0;
  std::int64_t evictions = 0;
  std::int64_t bytes_evicted = 0;
};

}  // namespace hybridcache::prefix
