// hybridcache/sim/python_float.hpp
//
// Python's `repr(float)` in C++, so files written here are byte-identical to files Python's
// `json.dump` writes (the synth-v1 generator's `ts`, for one).
//
// CPython formats a float with the shortest decimal string that reads back to the same
// double (David Gay's dtoa, mode 0; among equally short strings the closest). It prints
// that string positionally when the decimal exponent e (of d.ddd × 10^e) satisfies
// -4 <= e < 16, appending ".0" to integers (`1.0`, `62.345`, `0.0001`), and otherwise in
// scientific form with a signed, at least two-digit exponent (`1e+16`, `1.5e-05`).
// `std::to_chars` in scientific form gives exactly the same shortest, closest digits, so we
// take its digits and exponent and lay them out by Python's rule. json.dump writes the
// non-finite values as `NaN`, `Infinity`, `-Infinity`; so do we.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <system_error>

namespace hybridcache::sim {

/// Appends Python's `repr(value)` (as `json.dump` writes it) to `out`. Cost: O(1), no
/// allocation beyond the growth of `out`.
inline void append_python_float_repr(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
    return;
  }
  if (std::isinf(value)) {
    out += value < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  // "-d.ddde+XX": split sign, significant digits and exponent.
  const char* p = buffer;
  const char* const end = result.ptr;
  bool negative = false;
  if (*p == '-') {
    negative = true;
    ++p;
  }
  char digits[32];
  int num_digits = 0;
  while (p != end && *p != 'e') {
    if (*p != '.') digits[num_digits++] = *p;
    ++p;
  }
  int exponent = 0;
  if (p != end) {
    ++p;  // 'e'
    std::from_chars(*p == '+' ? p + 1 : p, end, exponent);
  }
  if (negative) out += '-';
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<std::size_t>(-exponent - 1), '0');
      out.append(digits, static_cast<std::size_t>(num_digits));
    } else if (num_digits <= exponent + 1) {
      out.append(digits, static_cast<std::size_t>(num_digits));
      out.append(static_cast<std::size_t>(exponent + 1 - num_digits), '0');
      out += ".0";
    } else {
      out.append(digits, static_cast<std::size_t>(exponent + 1));
      out += '.';
      out.append(digits + exponent + 1, static_cast<std::size_t>(num_digits - exponent - 1));
    }
    return;
  }
  out += digits[0];
  if (num_digits > 1) {
    out += '.';
    out.append(digits + 1, static_cast<std::size_t>(num_digits - 1));
  }
  out += 'e';
  out += exponent < 0 ? '-' : '+';
  const int magnitude = std::abs(exponent);
  if (magnitude < 10) out += '0';
  out += std::to_string(magnitude);
}

/// Python's `repr(value)` as a new string.
[[nodiscard]] inline std::string python_float_repr(double value) {
  std::string s;
  append_python_float_repr(s, value);
  return s;
}

}  // namespace hybridcache::sim
