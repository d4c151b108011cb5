// hybridcache/core/byte_size.hpp
//
// The one grammar for byte sizes. Every size a user types reads through it: hcbench's
// --capacity, --capacities and --budget, and the SIZE of each `kind=SIZE` item of a tier
// spec (`--tiers hbm=16GiB,host=64GB`, tiered/tier.hpp).
//
//   size     = space* number space* [unit] space*
//   number   = digits ["." [digits]] [exponent]  |  "." digits [exponent]
//   exponent = ("e" | "E") ["+" | "-"] digits
//   unit     = "B"                                        (1)
//            | "KB" | "MB" | "GB" | "TB" | "PB"            (10^3, 10^6, 10^9, 10^12, 10^15)
//            | "KiB" | "MiB" | "GiB" | "TiB" | "PiB"       (2^10, 2^20, 2^30, 2^40, 2^50)
//
// Units are case-insensitive ("5gb", "1kib"); space is ASCII white space. Examples:
// "5e10", "1.5e3KB" (1,500,000), "4.1GB" (4,100,000,000), "0.5KiB" (512), "10 GiB", ".5KB",
// "5.", "0".
//
// The value is exact: the digits are combined as integers, never through a double, so
// "4.1GB" is 4,100,000,000 and not 4,099,999,999. It must be a whole number of bytes that
// fits in int64 (0 ..= 9,223,372,036,854,775,807). Errors, never rounded or truncated:
//   - a fraction of a byte: "1.5B", "0.3KiB" (307.2), "1e-1";
//   - more than int64: "9223372036854775808", "1e19", "8388608TiB";
//   - a sign ("-1", "+1"), no digits ("", "GB", ".", "inf", "nan"), an exponent without
//     digits ("1e+"), hex ("0x10": unit 'x10'), trailing text ("1 2", "1GB x"), two units
//     or an unknown one ("1GBB", "8EiB", "1e": unit 'e');
//   - a bare K/M/G/T/P ("4K"): ambiguous between 10^3 and 2^10, so it is refused with a
//     message naming both spellings; likewise "Ki" without its B.
// Zero is a valid size; callers that need a positive one say so themselves.
//
// Costs: O(length of the text), no allocation, no locale, constexpr. `scan_byte_size` and
// `parse_byte_size` never throw; `parse_byte_size_or_throw` builds its message only on error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"

namespace hybridcache {

/// Why a text is not a byte size.
enum class byte_size_error : unsigned char {
  none = 0,
  empty,           ///< nothing but white space
  no_number,       ///< no digits where the number belongs ("GB", ".", "inf")
  sign,            ///< a leading '-' or '+'
  bad_exponent,    ///< 'e' and a sign but no exponent digits ("1e+")
  unknown_unit,    ///< a unit outside the grammar ("XB", "EiB", "GBB", "x10")
  ambiguous_unit,  ///< a bare K/M/G/T/P, or Ki/Mi/Gi/Ti/Pi without its B
  trailing_text,   ///< something after the number and unit ("1 2")
  not_whole,       ///< not a whole number of bytes ("1.5B")
  too_large,       ///< more than INT64_MAX bytes
};

/// Short name of a byte_size_error.
[[nodiscard]] constexpr std::string_view to_string(byte_size_error e) noexcept {
  constexpr std::array<std::string_view, 10> names{"none", "empty", "no_number", "sign", "bad_exponent",
    "unknown_unit", "ambiguous_unit", "trailing_text", "not_whole", "too_large"};
  static_assert(names_every_enumerator(names, byte_size_error::too_large));
  return enum_name(e, names);
}

/// Result of `scan_byte_size`: the size, or why there is none.
struct byte_size_result {
  std::int64_t bytes = 0;                      ///< the size when `error == none`, else 0
  byte_size_error error = byte_size_error::none;
  /// The offending piece of the text (the sign, the unit, the exponent, the trailing text);
  /// empty when the error concerns the whole text. A view into the scanned text.
  std::string_view part{};
  [[nodiscard]] constexpr bool ok() const noexcept { return error == byte_size_error::none; }
  constexpr explicit operator bool() const noexcept { return ok(); }
};

namespace detail {
constexpr bool byte_size_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
constexpr bool byte_size_digit(char c) noexcept { return c >= '0' && c <= '9'; }
constexpr bool byte_size_alpha(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr char byte_size_lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
/// 1..5 for k, m, g, t, p (either case); 0 otherwise.
constexpr int byte_size_prefix(char c) noexcept {
  switch (byte_size_lower(c)) {
    case 'k': return 1;
    case 'm': return 2;
    case 'g': return 3;
    case 't': return 4;
    case 'p': return 5;
    default: return 0;
  }
}
}  // namespace detail

namespace detail {
/// The pieces `scan_byte_size` reads, as positions in the text and powers.
struct byte_size_parts {
  std::size_t ib = 0, ie = 0;  ///< integer digits [ib, ie)
  std::size_t fb = 0, fe = 0;  ///< fraction digits [fb, fe)
  std::int64_t exp10 = 0;      ///< the exponent (saturated, see below)
  int pow10 = 0;               ///< decimal unit: 10^pow10
  int pow2 = 0;                ///< binary unit: 2^pow2
};

/// The mantissa and exponent from text[i] (past the leading space and sign check); `i`
/// moves past them. An error, or a result with error none.
constexpr byte_size_result scan_byte_size_number(std::string_view text, std::size_t& i, byte_size_parts& p) noexcept {
  using E = byte_size_error;
  const std::size_t n = text.size();
  p.ib = i;
  while (i < n && byte_size_digit(text[i])) ++i;
  p.ie = p.fb = p.fe = i;
  if (i < n && text[i] == '.') {
    p.fb = ++i;
    while (i < n && byte_size_digit(text[i])) ++i;
    p.fe = i;
  }
  if (p.ie == p.ib && p.fe == p.fb) return {0, E::no_number, {}};
  // Exponent. An 'e' not followed by a sign or digit starts a unit instead ("1e", "5EB"),
  // reported as an unknown unit. The exponent saturates at |length| + 100: beyond that
  // the value is 0, more than int64, or a fraction of a byte whatever its exact value.
  if (i + 1 < n && (text[i] == 'e' || text[i] == 'E') &&
      (byte_size_digit(text[i + 1]) || text[i + 1] == '+' || text[i + 1] == '-')) {
    std::size_t j = i + 1;
    const bool negative = text[j] == '-';
    if (text[j] == '+' || text[j] == '-') ++j;
    if (j == n || !byte_size_digit(text[j])) return {0, E::bad_exponent, text.substr(i, j - i)};
    const std::size_t len_cap = std::size_t{1} << 40;
    const std::int64_t cap = static_cast<std::int64_t>(n < len_cap ? n : len_cap) + 100;
    for (; j < n && byte_size_digit(text[j]); ++j)
      if (p.exp10 <= cap) p.exp10 = p.exp10 * 10 + (text[j] - '0');
    if (negative) p.exp10 = -p.exp10;
    i = j;
  }
  return {};
}

/// The unit from text[i] (after space) and nothing but space after it.
constexpr byte_size_result scan_byte_size_unit(std::string_view text, std::size_t i, byte_size_parts& p) noexcept {
  using E = byte_size_error;
  const std::size_t n = text.size();
  while (i < n && byte_size_space(text[i])) ++i;
  // A letter followed by letters and digits (so "0x10" names 'x10' whole).
  if (i < n && byte_size_alpha(text[i])) {
    std::size_t ue = i;
    while (ue < n && (byte_size_alpha(text[ue]) || byte_size_digit(text[ue]))) ++ue;
    const std::string_view unit = text.substr(i, ue - i);
    const int prefix = byte_size_prefix(unit[0]);
    const char last = byte_size_lower(unit.back());
    if (unit.size() == 1 && byte_size_lower(unit[0]) == 'b') {
      // bytes
    } else if (unit.size() == 2 && prefix != 0 && last == 'b') {
      p.pow10 = 3 * prefix;
    } else if (unit.size() == 3 && prefix != 0 && byte_size_lower(unit[1]) == 'i' && last == 'b') {
      p.pow2 = 10 * prefix;
    } else if (prefix != 0 && (unit.size() == 1 || (unit.size() == 2 && last == 'i'))) {
      return {0, E::ambiguous_unit, unit};
    } else {
      return {0, E::unknown_unit, unit};
    }
    i = ue;
    while (i < n && byte_size_space(text[i])) ++i;
  }
  if (i != n) {
    std::size_t te = n;
    while (te > i && byte_size_space(text[te - 1])) --te;
    return {0, E::trailing_text, text.substr(i, te - i)};
  }
  return {};
}

/// The exact value of the parts, or too_large / not_whole.
constexpr byte_size_result byte_size_value(std::string_view text, const byte_size_parts& p) noexcept {
  using E = byte_size_error;
  // Value = 0.d1 d2 ... dc x 10^point x 2^pow2, the digits being the integer digits then the
  // fraction digits, `point` digits of them before the decimal point.
  const std::int64_t n_int = static_cast<std::int64_t>(p.ie - p.ib);
  const std::int64_t count = n_int + static_cast<std::int64_t>(p.fe - p.fb);
  const auto digit = [&](std::int64_t idx) -> std::uint64_t {
    if (idx < 0 || idx >= count) return 0;
    const char c = idx < n_int ? text[p.ib + static_cast<std::size_t>(idx)]
                               : text[p.fb + static_cast<std::size_t>(idx - n_int)];
    return static_cast<std::uint64_t>(c - '0');
  };
  std::int64_t first = 0;  // first non-zero digit
  while (first < count && digit(first) == 0) ++first;
  if (first == count) return {0, E::none, {}};  // zero, whatever the exponent and unit
  std::int64_t last = count - 1;  // last non-zero digit
  while (digit(last) == 0) --last;
  const std::int64_t point = n_int + p.exp10 + p.pow10;

  // Whole part: the digits first .. point-1 (zeros past the last digit). A value of 20 or
  // more digits is at least 10^19 > INT64_MAX; 19 digits fit in uint64.
  std::uint64_t whole = 0;
  if (point > first) {
    if (point - first > 19) return {0, E::too_large, {}};
    for (std::int64_t idx = first; idx < point; ++idx) whole = whole * 10 + digit(idx);
  }
  constexpr std::uint64_t max = 9223372036854775807u;
  if (whole > max) return {0, E::too_large, {}};  // "9223372036854775808.5": too large first

  // Fraction part: the digits point .. last, times 2^pow2, must be an integer. 2^pow2 times
  // a fraction of k significant decimal places is whole only if k <= pow2 (1/2^p has exactly
  // p decimal places), so at most 50 digits are read. Horner from the last digit keeps every
  // step exact: when the final value is an integer, so is each tail times 2^pow2, hence any
  // remainder means a fraction of a byte. Every step stays below 10 x 2^50.
  const std::uint64_t scale = std::uint64_t{1} << p.pow2;
  std::uint64_t part = 0;
  if (last >= point) {
    if (last + 1 - point > p.pow2) return {0, E::not_whole, {}};
    for (std::int64_t idx = last; idx >= point; --idx) {
      const std::uint64_t v = digit(idx) * scale + part;
      if (v % 10 != 0) return {0, E::not_whole, {}};
      part = v / 10;
    }
  }
  if (whole > (max - part) / scale) return {0, E::too_large, {}};
  return {static_cast<std::int64_t>(whole * scale + part), E::none, {}};
}
}  // namespace detail

/// Reads `text` as a byte size (grammar above). Never throws, never allocates.
[[nodiscard]] constexpr byte_size_result scan_byte_size(std::string_view text) noexcept {
  using E = byte_size_error;
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n && detail::byte_size_space(text[i])) ++i;
  if (i == n) return {0, E::empty, {}};
  if (text[i] == '-' || text[i] == '+') return {0, E::sign, text.substr(i, 1)};
  detail::byte_size_parts parts;
  if (const auto r = detail::scan_byte_size_number(text, i, parts); !r) return r;
  if (const auto r = detail::scan_byte_size_unit(text, i, parts); !r) return r;
  return detail::byte_size_value(text, parts);
}

/// Reads `text` as a byte size; errc::invalid_argument when it is not one (use
/// `scan_byte_size` for the reason). Never throws, never allocates.
[[nodiscard]] constexpr expected<std::int64_t> parse_byte_size(std::string_view text) noexcept {
  const byte_size_result r = scan_byte_size(text);
  if (!r) return unexpected(errc::invalid_argument);
  return r.bytes;
}

namespace detail {
/// `text` with control characters escaped, so a message stays on one line.
inline std::string byte_size_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
      out += c;
      continue;
    }
    constexpr char hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[(static_cast<unsigned char>(c) >> 4) & 0xf];
    out += hex[static_cast<unsigned char>(c) & 0xf];
  }
  return out;
}
}  // namespace detail

/// One-line reason for a failed scan, e.g. "unknown unit 'XB' (...)".
[[nodiscard]] inline std::string byte_size_reason(const byte_size_result& r) {
  using E = byte_size_error;
  const std::string part = detail::byte_size_quote(r.part);
  constexpr const char* examples = "e.g. 5e8, 512MiB, 4.1GB";
  switch (r.error) {
    case E::none: return "ok";
    case E::empty: return std::string("empty; expected a byte size (") + examples + ")";
    case E::no_number: return std::string("not a size: no number (") + examples + ")";
    case E::sign: return part == "-" ? "negative; a size is >= 0" : "a size takes no sign";
    case E::bad_exponent: return "exponent '" + part + "' has no digits";
    case E::unknown_unit:
      return "unknown unit '" + part +
             "' (units: B, KB MB GB TB PB = 10^3..10^15, KiB MiB GiB TiB PiB = 2^10..2^50, any case)";
    case E::ambiguous_unit: {
      const char p = static_cast<char>(part[0] >= 'a' ? part[0] - 'a' + 'A' : part[0]);
      if (part.size() == 2) return "unit '" + part + "' is incomplete: write " + p + "iB";
      return "unit '" + part + "' is ambiguous: write " + p + "B (10^" + std::to_string(3 * detail::byte_size_prefix(p)) +
             ") or " + p + "iB (2^" + std::to_string(10 * detail::byte_size_prefix(p)) + ")";
    }
    case E::trailing_text: return "unexpected '" + part + "' after the size (" + examples + ")";
    case E::not_whole: return "not a whole number of bytes";
    case E::too_large: return "more than 9223372036854775807 bytes (int64)";
  }
  return "not a byte size";
}

/// Reads `text` as a byte size.
/// @throws overflow_error when it exceeds int64, invalid_argument for anything else that is
///         not a byte size; the one-line message is "<what> '<text>': <reason>".
[[nodiscard]] inline std::int64_t parse_byte_size_or_throw(std::string_view text, std::string_view what) {
  const byte_size_result r = scan_byte_size(text);
  if (r) return r.bytes;
  const std::string message = std::string(what) + " '" + detail::byte_size_quote(text) + "': " + byte_size_reason(r);
  if (r.error == byte_size_error::too_large) throw overflow_error(message);
  throw invalid_argument(message);
}

}  // namespace hybridcache
