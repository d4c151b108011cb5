// hybridcache/core/expected.hpp
//
// `expected<T>`: the result type of hot-path calls (allocate, free, match, resolve).
//
// Hot paths never throw and never allocate; they report failure as an `errc` value. This
// is a deliberately small subset of C++23 std::expected (g++ 12 offers it only under
// -std=c++23): has_value / operator bool, value() (throws on error, for callers that
// prefer exceptions), error(), operator* and operator->. `expected<void>` carries only an
// error code.
#pragma once

#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "hybridcache/core/error.hpp"

namespace hybridcache {

/// Error codes returned by hot-path calls.
enum class errc : unsigned char {
  ok = 0,
  out_of_capacity,   ///< nothing free and nothing evictable/migratable
  stale_handle,      ///< handle generation does not match the slot
  double_free,       ///< slot is already free
  foreign_handle,    ///< handle belongs to another pool or table
  invalid_argument,  ///< argument out of range (size 0, position outside a sequence, ...)
  not_found,         ///< no such entry
  busy,              ///< entry is pinned or being copied
};

/// Human-readable name of an error code.
[[nodiscard]] constexpr std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::out_of_capacity: return "out_of_capacity";
    case errc::stale_handle: return "stale_handle";
    case errc::double_free: return "double_free";
    case errc::foreign_handle: return "foreign_handle";
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::busy: return "busy";
  }
  return "unknown";
}

/// Throws the exception of the hierarchy that matches `e` (for `expected::value()`).
[[noreturn]] inline void throw_errc(errc e) {
  switch (e) {
    case errc::stale_handle:
    case errc::double_free:
    case errc::foreign_handle: throw handle_error(std::string(to_string(e)));
    case errc::out_of_capacity: throw capacity_error(std::string(to_string(e)));
    default: throw invalid_argument(std::string(to_string(e)));
  }
}

/// Tag wrapper that constructs an `expected` in the error state.
struct unexpected {
  errc code;
  constexpr explicit unexpected(errc e) noexcept : code(e) {}
};

/// Either a `T` or an `errc`. Trivially copyable when `T` is.
template <class T>
class expected {
  static_assert(!std::is_reference_v<T>, "expected<T&> is not supported");

 public:
  using value_type = T;

  constexpr expected(const T& v) noexcept(std::is_nothrow_copy_constructible_v<T>)  // NOLINT
      : value_(v), error_(errc::ok) {}
  constexpr expected(T&& v) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT
      : value_(std::move(v)), error_(errc::ok) {}
  constexpr expected(unexpected u) noexcept : value_(), error_(u.code) {}  // NOLINT

  [[nodiscard]] constexpr bool has_value() const noexcept { return error_ == errc::ok; }
  constexpr explicit operator bool() const noexcept { return has_value(); }
  [[nodiscard]] constexpr errc error() const noexcept { return error_; }

  /// The value; throws the matching `hybridcache::error` when this holds an error.
  [[nodiscard]] constexpr const T& value() const& {
    if (!has_value()) throw_errc(error_);
    return value_;
  }
  [[nodiscard]] constexpr T& value() & {
    if (!has_value()) throw_errc(error_);
    return value_;
  }
  [[nodiscard]] constexpr T value_or(T fallback) const { return has_value() ? value_ : fallback; }

  /// Unchecked access (precondition: has_value()).
  constexpr const T& operator*() const noexcept { return value_; }
  constexpr T& operator*() noexcept { return value_; }
  constexpr const T* operator->() const noexcept { return &value_; }
  constexpr T* operator->() noexcept { return &value_; }

 private:
  // T must be default constructible so the error state needs no union; every hot-path
  // payload in the library (handles, indices, sizes) is.
  static_assert(std::is_default_constructible_v<T>, "expected<T> needs a default-constructible T");
  T value_;
  errc error_;
};

/// Success or an error code.
template <>
class expected<void> {
 public:
  constexpr expected() noexcept = default;
  constexpr expected(unexpected u) noexcept : error_(u.code) {}  // NOLINT
  [[nodiscard]] constexpr bool has_value() const noexcept { return error_ == errc::ok; }
  constexpr explicit operator bool() const noexcept { return has_value(); }
  [[nodiscard]] constexpr errc error() const noexcept { return error_; }
  /// Throws the matching `hybridcache::error` when this holds an error.
  constexpr void value() const {
    if (!has_value()) throw_errc(error_);
  }

 private:
  errc error_ = errc::ok;
};

}  // namespace hybridcache
