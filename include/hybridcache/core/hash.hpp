// hybridcache/core/hash.hpp
//
// splitmix64's 64-bit mixer, the one bit mixer of the library (the synth-v1 PRNG, the
// tokenizer's tables), and `content_key`, the one content key of token prefixes (the
// tiered store's lower-tier entries and the storage backends below it).
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

/// Content keys of token prefixes, the one rule of the library (vLLM/SGLang-style chained
/// block hashing at token granularity): key(t_0 .. t_{n-1}) = next(... next(seed, t_0) ...,
/// t_{n-1}). The seed names the model and the tenant (cache salt), so two stores serving
/// the same model agree on every key, two models never share one, and two tenants never
/// share one. A false match needs a 2^-64 collision. `model_id` 0 is "unnamed" (one model
/// per store): it leaves the seed as it was before models were named.
struct content_key {
  [[nodiscard]] static constexpr std::uint64_t seed(std::uint64_t model_id = 0,
                                                    std::optional<std::uint64_t> salt = std::nullopt) noexcept {
    std::uint64_t h = splitmix64_gamma;
    if (model_id != 0) h = splitmix64_mix(h ^ splitmix64_mix(model_id ^ 0x3d0de1c0ffee0000ULL));
    if (salt) h = splitmix64_mix(h ^ splitmix64_mix(*salt ^ 0x5a17ed0c0ffee000ULL));
    return h;
  }
  [[nodiscard]] static constexpr std::uint64_t next(std::uint64_t h, std::int32_t token) noexcept {
    return splitmix64_mix(h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(token)) + 0x632be59bd9b4e019ULL));
  }
};

}  // namespace hybridcache
