// hybridcache/core/checked_math.hpp
//
// Exact int64 arithmetic that throws `overflow_error` naming the quantity instead of
// wrapping. Byte and FLOP counts are integers in this library wherever they are exact.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>
#include <string>

#include "hybridcache/core/error.hpp"

namespace hybridcache {

/// a * b, or throws overflow_error("<what> overflows int64").
[[nodiscard]] inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw overflow_error(std::string(what) + " overflows int64");
  return r;
}

/// a + b, or throws overflow_error("<what> overflows int64").
[[nodiscard]] inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw overflow_error(std::string(what) + " overflows int64");
  return r;
}

/// Product of all factors, checked.
template <class... Ints>
[[nodiscard]] inline std::int64_t checked_product(std::string_view what, std::int64_t first, Ints... rest) {
  std::int64_t r = first;
  ((r = checked_mul(r, static_cast<std::int64_t>(rest), what)), ...);
  return r;
}

/// ceil(a / b) for a >= 0, b > 0 (no intermediate overflow, up to a = int64 max).
[[nodiscard]] constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// a * b for a, b >= 0, or int64 max where it would overflow: for sizes on hot paths that
/// are compared against a capacity (a saturated size never fits), where throwing is not
/// an option.
[[nodiscard]] constexpr std::int64_t saturating_mul(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}

/// a + b for a, b >= 0, or int64 max where it would overflow.
[[nodiscard]] constexpr std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::int64_t>::max() : r;
}

}  // namespace hybridcache
