// hybridcache/sim/trace_stats.hpp
//
// What a trace allows at best: the hit rate of an infinite prefix cache.
//
// Definition (the one the Mooncake README's 36.64 % uses). Requests are taken in arrival
// order. A request's hit is the longest prefix of its `input` ids that an earlier request
// already inserted; after matching, the request inserts its input (and, with
// `insert_output`, its input followed by its output, as Marconi's replay does). Nothing is
// ever evicted. Then
//
//   id hit rate    = sum(hit ids) / sum(input ids)
//   token hit rate = sum(min(hit ids * tokens_per_id, input_tokens)) / sum(input_tokens)
//
// For Mooncake at B = 512 the id hit rate is 105,710 / 288,500 = 36.64 % of blocks: with
// chained ids "longest seen prefix" and "any id seen before" count the same, which is
// exactly (total blocks - unique blocks) / total blocks. The token rate is a little higher
// (37.36 %) because the partial last block of a request is counted by its real tokens
// only in the denominator.
//
// Prefixes are remembered as 64-bit chained hashes in an open-addressing set (one
// probe sequence per id), so the bound works for any id sequence (token traces included),
// not only for chained block ids. A false hit needs a 64-bit collision: with n distinct
// prefixes the chance is about n^2 / 2^65 (1e-5 for 10^7 prefixes).
// Cost: O(total ids) time, 16 bytes per distinct prefix.
//
// `summarize_trace` gives the plain shape of a trace (counts, lengths, time span) in one
// streaming pass, for tools that describe a trace before replaying it.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

/// Result of `infinite_cache_bound`.
struct infinite_cache_result {
  std::int64_t requests = 0;
  std::int64_t input_ids = 0;     ///< ids (blocks, or tokens for token traces) in all prompts
  std::int64_t hit_ids = 0;       ///< of which matched a prefix inserted earlier
  std::int64_t input_tokens = 0;  ///< real prompt tokens
  std::int64_t hit_tokens = 0;    ///< min(hit_ids * tokens_per_id, input_tokens), summed

  /// hit_ids / input_ids (0 for an empty trace).
  [[nodiscard]] double id_hit_rate() const noexcept {
    return input_ids == 0 ? 0.0 : static_cast<double>(hit_ids) / static_cast<double>(input_ids);
  }
  /// hit_tokens / input_tokens (0 for an empty trace).
  [[nodiscard]] double token_hit_rate() const noexcept {
    return input_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / static_cast<double>(input_tokens);
  }
};

/// Options of `infinite_cache_bound`.
struct infinite_cache_options {
  /// Insert input + output (Marconi's replay) instead of the input only. No effect on
  /// Mooncake, whose output ids are unique.
  bool insert_output = true;
};

namespace detail {

/// Open-addressing set of nonzero 64-bit keys (linear probing, load <= 1/2).
class prefix_hash_set {
 public:
  prefix_hash_set() : slots_(1024, 0) {}

  [[nodiscard]] bool contains(std::uint64_t key) const noexcept {
    for (std::size_t i = key & mask(); ; i = (i + 1) & mask()) {
      if (slots_[i] == key) return true;
      if (slots_[i] == 0) return false;
    }
  }

  void insert(std::uint64_t key) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    place(key);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }

  void place(std::uint64_t key) noexcept {
    for (std::size_t i = key & mask(); ; i = (i + 1) & mask()) {
      if (slots_[i] == key) return;
      if (slots_[i] == 0) {
        slots_[i] = key;
        ++size_;
        return;
      }
    }
  }

  void grow() {
    std::vector<std::uint64_t> old(slots_.size() * 2, 0);
    old.swap(slots_);
    size_ = 0;
    for (std::uint64_t key : old)
      if (key != 0) place(key);
  }

  std::vector<std::uint64_t> slots_;
  std::size_t size_ = 0;
};

/// Chained prefix hash: h(prefix + id) from h(prefix). Never returns 0 (the empty slot).
[[nodiscard]] constexpr std::uint64_t extend_prefix_hash(std::uint64_t h, token_id id) noexcept {
  std::uint64_t z = h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(id)) + 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z == 0 ? 1 : z;
}

}  // namespace detail

/// Replays `source` through an infinite prefix cache and returns its hit counts.
template <request_source S>
[[nodiscard]] infinite_cache_result infinite_cache_bound(S& source, infinite_cache_options options = {}) {
  infinite_cache_result result;
  detail::prefix_hash_set seen;
  request r;
  constexpr std::uint64_t root = 0x6A09E667F3BCC908ULL;
  while (source.next(r)) {
    ++result.requests;
    std::uint64_t h = root;
    std::int64_t matched = 0;
    bool matching = true;
    for (token_id id : r.input) {
      h = detail::extend_prefix_hash(h, id);
      if (matching && seen.contains(h)) {
        ++matched;
      } else {
        matching = false;
        seen.insert(h);
      }
    }
    if (options.insert_output)
      for (token_id id : r.output) {
        h = detail::extend_prefix_hash(h, id);
        seen.insert(h);
      }
    result.input_ids += static_cast<std::int64_t>(r.input.size());
    result.hit_ids += matched;
    result.input_tokens += r.input_tokens;
    const std::int64_t hit_tokens = matched * r.tokens_per_id;
    result.hit_tokens += hit_tokens < r.input_tokens ? hit_tokens : r.input_tokens;
  }
  return result;
}

/// Shape of a trace (`summarize_trace`).
struct trace_summary {
  std::int64_t requests = 0;
  std::int64_t sessions = 0;            ///< distinct session ids >= 0 (0 when the format has none)
  std::int64_t input_tokens = 0;        ///< sum of real prompt lengths
  std::int64_t output_tokens = 0;       ///< sum of real output lengths
  std::int64_t max_input_tokens = 0;    ///< longest prompt
  std::int64_t max_output_tokens = 0;   ///< longest output
  double first_arrival_s = 0.0;         ///< arrival of the first request
  double last_arrival_s = 0.0;          ///< arrival of the last request
  bool has_ids = true;                  ///< every request carries ids (prefix caches can replay it)

  /// Mean prompt length (0 for an empty trace).
  [[nodiscard]] double mean_input_tokens() const noexcept {
    return requests == 0 ? 0.0 : static_cast<double>(input_tokens) / static_cast<double>(requests);
  }
  /// last_arrival_s - first_arrival_s.
  [[nodiscard]] double duration_s() const noexcept { return last_arrival_s - first_arrival_s; }
};

/// One streaming pass over `source`. Cost: O(requests) time, O(sessions) memory.
template <request_source S>
[[nodiscard]] trace_summary summarize_trace(S& source) {
  trace_summary s;
  detail::prefix_hash_set sessions;  // session id + 1 (0 is the empty slot)
  request r;
  while (source.next(r)) {
    if (s.requests == 0) s.first_arrival_s = r.arrival_s;
    s.last_arrival_s = r.arrival_s;
    ++s.requests;
    s.input_tokens += r.input_tokens;
    s.output_tokens += r.output_tokens;
    s.max_input_tokens = r.input_tokens > s.max_input_tokens ? r.input_tokens : s.max_input_tokens;
    s.max_output_tokens = r.output_tokens > s.max_output_tokens ? r.output_tokens : s.max_output_tokens;
    s.has_ids = s.has_ids && r.has_ids();
    if (r.session_id >= 0) sessions.insert(static_cast<std::uint64_t>(r.session_id) + 1);
  }
  s.sessions = static_cast<std::int64_t>(sessions.size());
  return s;
}

}  // namespace hybridcache::sim
