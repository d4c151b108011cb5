// hybridcache/concepts/physical_store.hpp
//
// `physical_store`: what a pool needs from the store of one unit kind (KV pages or SSM
// blocks): acquire/release units, their addresses, chunk mapping and unit copies (for
// compaction). Models: memory/stores.hpp (paged_store over a host, counting, device or VMM
// backing).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "hybridcache/concepts/pool.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache {

/// What a pool needs from a store.
template <class S>
concept physical_store = requires(S& s, const S& cs, std::uint32_t u, typename S::arena_type& a) {
  typename S::backing_type;
  { S::kind } -> std::convertible_to<pool_kind>;
  requires std::constructible_from<S, typename S::arena_type&, std::uint64_t, std::uint32_t>;
  { s.acquire() } noexcept -> std::same_as<expected<std::uint32_t>>;
  { s.release(u) } noexcept;
  { cs.address(u) } noexcept -> std::same_as<std::byte*>;
  { s.map_chunk(u) } -> std::same_as<std::uint32_t>;
  { s.unmap_chunk(u) } -> std::same_as<std::uint32_t>;
  { s.copy_unit(u, u) };
  typename S::region_type;
  { cs.region() } -> std::same_as<const typename S::region_type&>;
};

}  // namespace hybridcache
