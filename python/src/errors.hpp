// python/src/errors.hpp: how the module reports a runtime call's `expected` error. The
// translator in module.cpp raises it as the Python exception of its code (InvalidArgument,
// OutOfCapacity, HandleError, Error) with the library's message and `.code` set.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include <hybridcache/core/expected.hpp>

namespace hybridcache::python {

/// An `error_info` on its way to Python: the code and `error_info::message()`.
struct library_error : std::runtime_error {
  errc code;
  explicit library_error(const error_info& e) : std::runtime_error(e.message()), code(e.code) {}
};

/// The value of `r`, or throws its error as a library_error.
template <class T>
decltype(auto) check(expected<T>&& r) {
  if (!r) throw library_error(r.info());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

/// A 1-D sequence of integers in [lo, hi] from a list/tuple of ints or a 1-D integer array of
/// any integer dtype (runtime.cpp). A float array, a str or a nested list raise TypeError; a
/// value out of range, a 2-D array raise InvalidArgument naming `what` and the index.
std::vector<std::int64_t> int_sequence(nanobind::handle h, const char* what, std::int64_t lo, std::int64_t hi);

}  // namespace hybridcache::python
