// hybridcache/concepts/match_result.hpp
//
// `match_result`: what `prefix_cache::match` found for one input. It is the prefix cache's
// answer and also what the store seam with a lower tier takes (`lower_tier_store::lookup`:
// concepts/tier_store.hpp), so it lives with them, below prefix/ and stores/. An
// aggregate, trivially copyable.
#pragma once

#include <cstdint>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache {

/// What `prefix_cache::match` found for one input.
///
/// `reusable_tokens` follows the joint-min rule: the prefix ends at a node end that holds
/// an SSM checkpoint, and every earlier token has KV in the cache, so prefill may start at
/// token `reusable_tokens` from the checkpoint's state. `common_prefix` is the longest
/// common prefix with the cached tokens ignoring checkpoints (>= reusable_tokens): when it is
/// larger, KV is cached beyond the last checkpoint (a "KV hit, SSM miss", the case vLLM
/// counters report) and speculative insertion will checkpoint there.
struct match_result {
  std::int64_t input_tokens = 0;     ///< length of the matched input
  std::int64_t reusable_tokens = 0;  ///< tokens whose prefill is skipped (0 on a miss)
  std::int64_t common_prefix = 0;    ///< longest common prefix ignoring checkpoints
  std::int64_t flops_saved = 0;      ///< cost_model::hit_flops(reusable_tokens)
  node_id node = no_node;            ///< deepest usable node (holds the checkpoint reused)
  packed_handle pin;                 ///< pin ticket; pass the result to `release` (null on a miss)
  time_point at = 0;                 ///< logical time of the match
  cache_salt salt = std::nullopt;    ///< the namespace looked in (commit inserts there)

  /// True when some prefill is skipped.
  [[nodiscard]] constexpr bool hit() const noexcept { return reusable_tokens > 0; }
  /// Checkpoints reused by this hit (one SSM state restores the whole prefix).
  [[nodiscard]] constexpr std::int64_t checkpoints_reused() const noexcept { return hit() ? 1 : 0; }
};

}  // namespace hybridcache
