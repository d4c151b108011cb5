// hybridcache/core/enum_names.hpp
//
// `enum_name(e, names)`: the name of an enumerator from a table indexed by its value, for
// the library's `to_string` overloads. Every enum named this way counts 0, 1, 2, ... in
// declaration order, and each `to_string` checks at compile time that its table has one
// name per enumerator (a static_assert on the last one), which is the check a `switch`
// without a default gave through -Wswitch. A value outside the table (a cast, a corrupt
// byte) is "unknown". Costs: O(1), constexpr, no allocation.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace hybridcache {

/// True when `names` has exactly one entry per enumerator of E up to and including `last`.
template <class E, std::size_t N>
  requires std::is_enum_v<E>
[[nodiscard]] constexpr bool names_every_enumerator(const std::array<std::string_view, N>& /*names*/, E last) noexcept {
  return static_cast<std::size_t>(static_cast<std::underlying_type_t<E>>(last)) + 1 == N;
}

/// names[e], or "unknown" for a value past the table.
template <class E, std::size_t N>
  requires std::is_enum_v<E>
[[nodiscard]] constexpr std::string_view enum_name(E e, const std::array<std::string_view, N>& names) noexcept {
  const auto i = static_cast<std::size_t>(static_cast<std::underlying_type_t<E>>(e));
  return i < N ? names[i] : std::string_view("unknown");
}

}  // namespace hybridcache
