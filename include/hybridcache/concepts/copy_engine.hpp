// hybridcache/concepts/copy_engine.hpp
//
// `tier_copy_engine`: what moves an entry's bytes between two tiers of the tiered store,
// and `move_ticket`, the move it is handed. Models: metadata_only_copies
// (tiered/copy_plan.hpp), host_copy_engine (tiered/host_copy_engine.hpp),
// cuda::copy_engine (tiered/cuda/copy_engine.cuh).
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache::tiered {

/// A move in flight: returned by `prepare_move`, consumed by `complete_move`.
struct move_ticket {
  entry_id id{};
  tier_id src{};
  tier_id dst{};
  std::int64_t src_bytes = 0;               ///< bytes held at the source
  std::int64_t dst_bytes = 0;               ///< bytes that will be stored at the destination
  std::vector<std::uint32_t> src_pages;     ///< in the entry's logical order
  std::vector<std::uint32_t> dst_pages;     ///< ascending (fresh pages)
  std::uint64_t seq = 0;                    ///< must match the entry's move sequence
};

/// What moves an entry's bytes between tiers: `submit(ticket)` enqueues the copies of a
/// prepared move (`tiered_store::prepare_move`) and returns an event or an error;
/// `wait(event)` blocks until they ran and reports a failed copy. Modelled by
/// `host_copy_engine`, `cuda::copy_engine` and `metadata_only_copies`.
template <class E>
concept tier_copy_engine = requires(E& e, const move_ticket& t) {
  { e.submit(t).has_value() } -> std::convertible_to<bool>;
  { e.wait(*e.submit(t)) } -> std::same_as<expected<void>>;
};

}  // namespace hybridcache::tiered
