// hybridcache/concepts/cost_model.hpp
//
// `prefix_cost_model`: what the prefix cache reads from a cost model (bytes, FLOPs, scan
// chunk). `hybridcache::cost_model` (model/cost_model.hpp) models it.
#pragma once

#include <concepts>
#include <cstdint>

namespace hybridcache {

/// What the cache reads from its cost model (`hybridcache::cost_model` models it).
///
/// - `kv_bytes_per_token()`, `ssm_checkpoint_bytes()`: the byte demand of a commit, used
///   to evict before allocating (one checkpoint must fit in the store, else the cache
///   constructor throws `capacity_error`).
/// - `hit_flops(s)`: FLOPs saved by a hit of `s` tokens (`match_result::flops_saved`).
/// - `saved_flops(p, L)`: marginal FLOPs of a node covering tokens (p, L] (FLOP-aware
///   eviction).
/// - `spec().scan_chunk`: the chunk size C of the chunked scan (`plan`).
template <class M>
concept prefix_cost_model = requires(const M& m, std::int64_t n) {
  { m.kv_bytes_per_token() } -> std::convertible_to<std::int64_t>;
  { m.ssm_checkpoint_bytes() } -> std::convertible_to<std::int64_t>;
  { m.hit_flops(n) } -> std::convertible_to<std::int64_t>;
  { m.saved_flops(n, n) } -> std::convertible_to<std::int64_t>;
  { m.spec().scan_chunk } -> std::convertible_to<std::int64_t>;
};

}  // namespace hybridcache
