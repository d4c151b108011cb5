// hybridcache/concepts/demotion.hpp
//
// The seams of demotion in the tiered store: which entry goes down a tier first
// (`demotion_scorer`; models in tiered/demotion_policy.hpp: lru_demotion,
// car_score_demotion, flop_aware_demotion) and how many bytes it keeps there
// (`demotion_sizer`; models in tiered/sparsify.hpp: keep_size, sparsify_on_demotion).
#pragma once

#include <concepts>
#include <cstdint>

#include "hybridcache/concepts/tier_entry.hpp"

namespace hybridcache {

/// A demotion scorer: `key(entry)` gives the entry's demotion order (smallest first).
template <class S>
concept demotion_scorer = std::copy_constructible<S> && requires(const S& s, const cache_entry& e) {
  { s.key(e) } -> std::same_as<demotion_key>;
};

/// How many bytes an entry keeps when it is demoted: the offload engine's sizing policy.
/// The mover copies that many bytes from the front of the entry, so a sparsifying runtime
/// first compacts the kept tokens (`select_tokens`) of each attention layer to the front.
template <class S>
concept demotion_sizer = requires(const S& s, const cache_entry& e) {
  { s.stored_bytes(e) } -> std::same_as<std::int64_t>;
};

}  // namespace hybridcache
