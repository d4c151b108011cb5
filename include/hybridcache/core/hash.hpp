// hybridcache/core/hash.hpp
//
// splitmix64's 64-bit mixer, the one bit mixer of the library: the prefix hashes of the
// tiered state store, the block ids of the tiered replay and the synth-v1 PRNG all use it.
//
// splitmix64 (Steele, Lea, Flood 2014) advances a state by the golden-ratio increment
// `splitmix64_gamma` and outputs `splitmix64_mix(state)`. Callers that want the generator's
// output for a state `x` write `splitmix64_mix(x + splitmix64_gamma)`; callers that only
// want a bijective finaliser call `splitmix64_mix(x)`. The two give different numbers:
// pick one per use and keep it, since hashes derived from it may be pinned by tests.
//
// O(1), constexpr, no allocation.
#pragma once

#include <cstdint>

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

}  // namespace hybridcache
