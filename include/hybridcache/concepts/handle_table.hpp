// hybridcache/concepts/handle_table.hpp
//
// `handle_table`: what a memory pool needs from its virtual handle table (packed handle ->
// physical unit, generation-checked). Model: memory/handle_table.hpp (unit_handle_table).
#pragma once

#include <concepts>
#include <cstdint>

#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/handle.hpp"

namespace hybridcache {

/// What a pool needs from its handle table.
template <class T>
concept handle_table = requires(T& t, const T& ct, packed_handle h, std::uint32_t unit, std::uint32_t index) {
  requires std::constructible_from<T, std::uint32_t, std::uint64_t>;  // (pool tag, capacity)
  { t.insert(unit) } noexcept -> std::same_as<expected<packed_handle>>;
  { ct.resolve(h) } noexcept -> std::same_as<expected<std::uint32_t>>;
  { t.erase(h) } noexcept -> std::same_as<expected<std::uint32_t>>;
  { ct.validate(h) } noexcept -> std::same_as<errc>;
  { t.relocate(index, unit) } noexcept;
  { ct.live_count() } noexcept -> std::convertible_to<std::uint64_t>;
  { ct.pool_tag() } noexcept -> std::convertible_to<std::uint32_t>;
};

}  // namespace hybridcache
