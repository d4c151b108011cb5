// hybridcache/core/expected.hpp
//
// `expected<T>`: the result type of hot-path calls (allocate, free, match, begin, resolve).
//
// Hot paths never throw and never allocate; they report failure as an `error_info`: an
// `errc` code plus, where the library knows more, a message naming the argument and its
// value ("begin: output_tokens must be >= 0", value -5). The message is a string literal
// and the value a plain integer, so building an error allocates nothing and an `expected`
// stays trivially copyable when `T` is; `message()` formats the text when asked.
//
// This is a deliberately small subset of C++23 std::expected (g++ 12 offers it only under
// -std=c++23): has_value / operator bool, value() (throws on error, for callers that
// prefer exceptions), error() (the code), info() / message() (the details), operator* and
// operator->. Dereferencing an error is a bug in the caller: it aborts with the error's
// message in debug builds (NDEBUG not defined, or HYBRIDCACHE_ENABLE_ASSERTIONS).
// `expected<void>` carries only an error.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "hybridcache/core/enum_names.hpp"
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
  constexpr std::array<std::string_view, 8> names{"ok", "out_of_capacity", "stale_handle", "double_free",
    "foreign_handle", "invalid_argument", "not_found", "busy"};
  static_assert(names_every_enumerator(names, errc::busy));
  return enum_name(e, names);
}

/// Why a call failed: the code, and where the caller passed something wrong, a short
/// message naming the call and the argument (a string literal: static storage) and the
/// offending value. Trivially copyable; building one allocates nothing.
struct error_info {
  errc code = errc::ok;
  bool has_value = false;      ///< `value` is meaningful
  const char* what = nullptr;  ///< "begin: output_tokens must be >= 0", or null
  std::int64_t value = 0;      ///< the offending value (when has_value)

  /// "invalid_argument: begin: output_tokens must be >= 0 (got -5)"; the code's name
  /// alone when there is no message. Allocates.
  [[nodiscard]] std::string message() const {
    std::string out(to_string(code));
    if (what != nullptr) {
      out += ": ";
      out += what;
      if (has_value) out += " (got " + std::to_string(value) + ")";
    }
    return out;
  }
  friend constexpr bool operator==(const error_info& a, errc b) noexcept { return a.code == b; }
};

/// Throws the exception of the hierarchy that matches `e` (for `expected::value()`), with
/// its message.
[[noreturn]] inline void throw_error(const error_info& e) {
  switch (e.code) {
    case errc::stale_handle:
    case errc::double_free:
    case errc::foreign_handle: throw handle_error(e.message());
    case errc::out_of_capacity: throw capacity_error(e.message());
    default: throw invalid_argument(e.message());
  }
}
/// The same for a bare code.
[[noreturn]] inline void throw_errc(errc e) { throw_error(error_info{e}); }

namespace detail {
/// Dereferencing an `expected` that holds an error: a caller bug, reported where it happens.
[[noreturn]] inline void bad_expected_access(const error_info& e) noexcept {
  std::fprintf(stderr, "hybridcache: dereferenced an expected that holds an error: %s\n", e.message().c_str());
  std::abort();
}
}  // namespace detail

/// Tag wrapper that constructs an `expected` in the error state:
/// `unexpected(errc::invalid_argument, "grow: tokens must be > 0", tokens)`.
struct unexpected {
  error_info info;
  constexpr explicit unexpected(errc e) noexcept : info{e} {}
  constexpr unexpected(errc e, const char* what) noexcept : info{e, false, what} {}
  constexpr unexpected(errc e, const char* what, std::int64_t value) noexcept : info{e, true, what, value} {}
  constexpr explicit unexpected(const error_info& i) noexcept : info(i) {}
};

/// Either a `T` or an `error_info`. Trivially copyable when `T` is.
template <class T>
class expected {
  static_assert(!std::is_reference_v<T>, "expected<T&> is not supported");

 public:
  using value_type = T;

  constexpr expected(const T& v) noexcept(std::is_nothrow_copy_constructible_v<T>)  // NOLINT
      : value_(v) {}
  constexpr expected(T&& v) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT
      : value_(std::move(v)) {}
  constexpr expected(unexpected u) noexcept : value_(), error_(u.info) {}  // NOLINT

  [[nodiscard]] constexpr bool has_value() const noexcept { return error_.code == errc::ok; }
  constexpr explicit operator bool() const noexcept { return has_value(); }
  /// The error code (errc::ok when this holds a value).
  [[nodiscard]] constexpr errc error() const noexcept { return error_.code; }
  /// The error with its message and value.
  [[nodiscard]] constexpr const error_info& info() const noexcept { return error_; }
  /// The error as text ("ok" when this holds a value). Allocates.
  [[nodiscard]] std::string message() const { return error_.message(); }

  /// The value; throws the matching `hybridcache::error` (with the message) on an error.
  [[nodiscard]] constexpr const T& value() const& {
    if (!has_value()) throw_error(error_);
    return value_;
  }
  [[nodiscard]] constexpr T& value() & {
    if (!has_value()) throw_error(error_);
    return value_;
  }
  [[nodiscard]] constexpr T value_or(T fallback) const { return has_value() ? value_ : fallback; }

  /// Unchecked access in release builds (precondition: has_value()); aborts with the
  /// error's message in debug builds.
  constexpr const T& operator*() const noexcept {
    check_access();
    return value_;
  }
  constexpr T& operator*() noexcept {
    check_access();
    return value_;
  }
  constexpr const T* operator->() const noexcept {
    check_access();
    return &value_;
  }
  constexpr T* operator->() noexcept {
    check_access();
    return &value_;
  }

 private:
  constexpr void check_access() const noexcept {
#if !defined(NDEBUG) || defined(HYBRIDCACHE_ENABLE_ASSERTIONS)
    if (!has_value()) detail::bad_expected_access(error_);
#endif
  }
  // T must be default constructible so the error state needs no union; every hot-path
  // payload in the library (handles, indices, sizes) is.
  static_assert(std::is_default_constructible_v<T>, "expected<T> needs a default-constructible T");
  T value_;
  error_info error_{};
};

/// Success or an error.
template <>
class expected<void> {
 public:
  constexpr expected() noexcept = default;
  constexpr expected(unexpected u) noexcept : error_(u.info) {}  // NOLINT
  [[nodiscard]] constexpr bool has_value() const noexcept { return error_.code == errc::ok; }
  constexpr explicit operator bool() const noexcept { return has_value(); }
  [[nodiscard]] constexpr errc error() const noexcept { return error_.code; }
  [[nodiscard]] constexpr const error_info& info() const noexcept { return error_; }
  [[nodiscard]] std::string message() const { return error_.message(); }
  /// Throws the matching `hybridcache::error` (with the message) on an error.
  constexpr void value() const {
    if (!has_value()) throw_error(error_);
  }

 private:
  error_info error_{};
};

}  // namespace hybridcache
