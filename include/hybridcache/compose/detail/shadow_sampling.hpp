// hybridcache/compose/detail/shadow_sampling.hpp
//
// The pieces of the adaptive selector's sampled shadows (compose/adaptive_scorer.hpp),
// after the storage-cache literature's miniature simulations (SHARDS,
// Waldspurger et al. FAST 2015; ATC 2017): each candidate's shadow sees only a spatially
// hashed sample of the request stream, at rate R, with its capacity scaled by R.
//
// - What is sampled: conversations, not requests. A request's key is a hash of its salt and
//   its first `key_ids` ids, so every turn of a conversation (each turn's input extends the
//   previous turn's sequence) lands on the same side, and a sampled shadow sees complete
//   prefix trees below the shared head. Why not the first id alone: traces whose requests
//   all start with one shared block (Mooncake: every request's first block is 0) would give
//   one key. A trace whose requests share a longer head than `key_ids` ids (a common system
//   prompt) has few keys: the estimate below then keeps the selector exact.
// - `sampled(key, rate)`: the key's hash, read as a fraction in [0, 1), below the rate.
// - `conversation_estimate`: how many conversations a cache of `capacity` bytes holds, as an
//   LRU over keys weighted by each key's latest sequence's bytes (what a cache that kept whole
//   conversations would hold). A sampled shadow of capacity x R holds about R times that;
//   the selector samples only once that product reaches a floor, because a miniature cache
//   that holds a handful of conversations ranks eviction rules by noise.
//
// Costs: `conversation_key` O(key_ids); `sampled` O(1); `conversation_estimate::observe`
// O(1) expected (one hash-map probe, list splices), allocating one map and list node per
// new key; it holds one entry per conversation that fits in the capacity.
// Internal to adaptive_scorer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::compose::detail {

/// The conversation key of a request: its salt (a tenant's requests never share a tree with
/// another's) and its first `key_ids` ids (all of them when shorter).
[[nodiscard]] inline std::uint64_t conversation_key(std::span<const token_id> ids, const cache_salt& salt,
                                                    std::int64_t key_ids) noexcept {
  std::uint64_t h = salt ? splitmix64_mix(*salt + splitmix64_gamma) : 0;
  const std::size_t n = std::min(ids.size(), static_cast<std::size_t>(std::max<std::int64_t>(key_ids, 1)));
  for (std::size_t i = 0; i < n; ++i)
    h = splitmix64_mix(h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(ids[i])) + splitmix64_gamma));
  return h;
}

/// Whether the conversation `key` is in the sample at `rate` (the top 53 bits of a second
/// mix, as a fraction in [0, 1), below the rate). Rate 1 samples every key.
[[nodiscard]] inline bool sampled(std::uint64_t key, double rate) noexcept {
  if (rate >= 1.0) return true;
  const double u = static_cast<double>(splitmix64_mix(key + splitmix64_gamma) >> 11) * 0x1.0p-53;
  return u < rate;
}

/// How many conversations a cache of `capacity` bytes holds: an LRU over conversation keys,
/// each weighing its latest sequence's bytes. See the file comment.
class conversation_estimate {
 public:
  explicit conversation_estimate(std::int64_t capacity = 0) : capacity_(capacity) {}

  /// One request of conversation `key` whose whole sequence takes `bytes`.
  void observe(std::uint64_t key, std::int64_t bytes) {
    bytes = std::max<std::int64_t>(bytes, 0);
    if (auto it = where_.find(key); it != where_.end()) {
      used_ += bytes - it->second->second;
      it->second->second = bytes;
      order_.splice(order_.begin(), order_, it->second);
    } else {
      order_.emplace_front(key, bytes);
      where_.emplace(key, order_.begin());
      used_ += bytes;
    }
    while (used_ > capacity_ && order_.size() > 1) {  // the newest stays, however large
      used_ -= order_.back().second;
      where_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  /// Heap bytes: one list node and one map node per conversation held, and the buckets. O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    using entry = std::pair<std::uint64_t, std::int64_t>;
    return static_cast<std::int64_t>(order_.size() * (2 * sizeof(void*) + sizeof(entry)) +
                                     where_.bucket_count() * sizeof(void*) +
                                     where_.size() * (2 * sizeof(void*) + sizeof(std::uint64_t) + sizeof(void*)));
  }
  /// Conversations held now.
  [[nodiscard]] std::int64_t held() const noexcept { return static_cast<std::int64_t>(order_.size()); }

 private:
  std::int64_t capacity_;
  std::int64_t used_ = 0;
  std::list<std::pair<std::uint64_t, std::int64_t>> order_;  // most recent first: (key, bytes)
  std::unordered_map<std::uint64_t, std::list<std::pair<std::uint64_t, std::int64_t>>::iterator> where_;
};

}  // namespace hybridcache::compose::detail
