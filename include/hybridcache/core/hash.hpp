// hybridcache/core/hash.hpp
//
// splitmix64's 64-bit mixer, the one bit mixer of the library: the prefix hashes of the
// tiered state store, the block ids of the tiered replay, the synth-v1 PRNG and the content
// keys of the storage backends all use it.
//
// splitmix64 (Steele, Lea, Flood 2014) advances a state by the golden-ratio increment
// `splitmix64_gamma` and outputs `splitmix64_mix(state)`. Callers that want the generator's
// output for a state `x` write `splitmix64_mix(x + splitmix64_gamma)`; callers that only
// want a bijective finaliser call `splitmix64_mix(x)`. The two give different numbers:
// pick one per use and keep it, since hashes derived from it may be pinned by tests.
//
// The content-key chain (`prefix_hash_seed`, `prefix_hash_step`) is built on it: the key of
// a token prefix [0, n) is the chain's value after n steps, seeded by the cache namespace,
// so equal prefixes in one namespace get equal keys on every node and every run.
//
// O(1), constexpr, no allocation.
#pragma once

#include <cstdint>
#include <optional>

namespace hybridcache {

/// splitmix64's state increment (2^64 / golden ratio, odd).
inline constexpr std::uint64_t splitmix64_gamma = 0x9e3779b97f4a7c15ULL;

/// splitmix64's output function: two xor-shift-multiply rounds and a final xor-shift.
/// A bijection on 64-bit values; `splitmix64_mix(0) == 0`.
[[nodiscard]] constexpr std::uint64_t splitmix64_mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The content-key chain's value for the empty prefix in the namespace `salt` (vLLM's
/// cache_salt; `std::nullopt` is the shared namespace). Two salts give unrelated chains, so
/// two tenants never share a key.
[[nodiscard]] constexpr std::uint64_t prefix_hash_seed(const std::optional<std::uint64_t>& salt) noexcept {
  std::uint64_t h = splitmix64_gamma;
  if (salt) h = splitmix64_mix(h ^ splitmix64_mix(*salt ^ 0x5a17ed0c0ffee000ULL));
  return h;
}

/// The chain after one more token: key([0, n+1)) = prefix_hash_step(key([0, n)), token n).
/// Token ids are read as 32-bit values (concepts/ids.hpp `token_id`).
[[nodiscard]] constexpr std::uint64_t prefix_hash_step(std::uint64_t h, std::int32_t token) noexcept {
  return splitmix64_mix(h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(token)) + 0x632be59bd9b4e019ULL));
}

}  // namespace hybridcache
