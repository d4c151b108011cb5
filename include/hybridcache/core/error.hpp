// hybridcache/core/error.hpp
//
// The library's small exception hierarchy, and the precondition macro that throws it.
//
// Every error the library raises derives from `hybridcache::error` (itself a
// std::runtime_error), so a caller can catch everything of ours in one place and nothing
// else. Derived kinds say what went wrong, not where:
//
//   error
//   ├── invalid_argument   bad input or configuration; the message names the field
//   │   └── overflow_error  an exact integer (bytes, FLOPs) does not fit in int64
//   ├── capacity_error     the request cannot fit even with everything evictable evicted
//   ├── handle_error       stale handle, double free, handle from another pool/table
//   ├── format_error       malformed trace input; carries the line number and field
//   └── cuda_error         a CUDA runtime/driver call failed; names the call and error
//
// Rule: a function that throws leaves every cache, pool and handle table unchanged
// (strong guarantee). Hot paths do not throw; they return `expected` (expected.hpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace hybridcache {

/// Base of every exception thrown by hybridcache.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error("hybridcache: " + what) {}
};

/// Invalid input or configuration. The message names the offending field or argument.
class invalid_argument : public error {
 public:
  using error::error;
};

/// An exact integer quantity (byte count, FLOP count) overflowed int64.
class overflow_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// A request cannot be placed even after evicting everything that may be evicted, or a
/// capacity is smaller than the smallest unit it must hold.
class capacity_error : public error {
 public:
  using error::error;
};

/// A handle is stale (its slot was freed and reused), freed twice, or belongs to another
/// pool or table. Detected through generation counters, never ignored.
class handle_error : public error {
 public:
  using error::error;
};

/// Malformed input data (a trace line). Carries the 1-based line and the field name.
class format_error : public error {
 public:
  format_error(std::int64_t line, std::string field, const std::string& what)
      : error("line " + std::to_string(line) + ", field '" + field + "': " + what),
        line_(line),
        field_(std::move(field)) {}

  /// 1-based line number in the input (0 when not line oriented).
  [[nodiscard]] std::int64_t line() const noexcept { return line_; }
  /// The field that could not be read.
  [[nodiscard]] const std::string& field() const noexcept { return field_; }

 private:
  std::int64_t line_;
  std::string field_;
};

/// A CUDA runtime or driver call failed. The message names the call and the error.
class cuda_error : public error {
 public:
  using error::error;
};

}  // namespace hybridcache

/// Throws `exception_type` with `message` unless `condition` holds. For preconditions on
/// user input at configuration and allocation boundaries, never inside hot loops.
#define HYBRIDCACHE_EXPECTS(condition, exception_type, message) \
  do {                                                          \
    if (!(condition)) throw exception_type(message);            \
  } while (0)
