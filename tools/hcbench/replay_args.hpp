// Argument parsing helpers shared by `hcbench replay` and `hcbench compare`.
//
// parse_capacity("5e8") == 500000000; "500000000", "5GB" (10^9), "4GiB" (2^30), "512 MiB",
// "1.5e9B" are accepted; units are B, kB/KB, MB, GB, TB (powers of 1000) and KiB, MiB,
// GiB, TiB (powers of 1024), case-insensitive. A value must be a positive whole number of
// bytes that fits in int64; anything else throws hybridcache::invalid_argument naming the
// text.
#pragma once

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/core/error.hpp>

namespace hcbench {

namespace detail {
inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace detail

/// Parses a byte capacity such as `5e8`, `500000000`, `5GB`, `4GiB`.
/// @throws hybridcache::invalid_argument naming `text` when it is not a positive whole
///         number of bytes representable in int64.
[[nodiscard]] inline std::int64_t parse_capacity(std::string_view text) {
  using hybridcache::invalid_argument;
  const std::string_view s = detail::trim(text);
  const auto bad = [&](const std::string& why) {
    return invalid_argument("capacity '" + std::string(text) + "': " + why +
                            " (examples: 5e8, 500000000, 5GB, 4GiB)");
  };
  std::size_t n = 0;  // length of the numeric part
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.' || s[n] == '+' ||
                          s[n] == '-' || ((s[n] == 'e' || s[n] == 'E') && n > 0 &&
                                          n + 1 < s.size() &&
                                          (std::isdigit(static_cast<unsigned char>(s[n + 1])) || s[n + 1] == '+' ||
                                           s[n + 1] == '-'))))
    ++n;
  const std::string_view number = s.substr(0, n);
  const std::string unit = detail::lower(detail::trim(s.substr(n)));
  if (number.empty()) throw bad("no number");

  struct unit_scale {
    const char* name;
    std::int64_t scale;
  };
  static constexpr unit_scale units[] = {
      {"", 1},           {"b", 1},
      {"kb", 1000},      {"mb", 1000 * 1000},  {"gb", 1000LL * 1000 * 1000},  {"tb", 1000LL * 1000 * 1000 * 1000},
      {"kib", 1LL << 10}, {"mib", 1LL << 20},  {"gib", 1LL << 30},            {"tib", 1LL << 40},
  };
  std::int64_t scale = 0;
  for (const auto& u : units)
    if (unit == u.name) scale = u.scale;
  if (scale == 0) throw bad("unknown unit '" + unit + "'");

  // Whole numbers are parsed exactly; anything with '.' or an exponent goes through double.
  const bool integral = number.find_first_of(".eE") == std::string_view::npos;
  if (integral) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec == std::errc::result_out_of_range) throw bad("too large");
    if (ec != std::errc() || p != number.data() + number.size()) throw bad("not a number");
    if (v <= 0) throw bad("must be > 0");
    if (v > std::numeric_limits<std::int64_t>::max() / scale) throw bad("too large");
    return v * scale;
  }
  double v = 0;
  auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
  if (ec != std::errc() || p != number.data() + number.size() || !std::isfinite(v)) throw bad("not a number");
  const double bytes = v * static_cast<double>(scale);
  if (!(bytes >= 1.0)) throw bad("must be at least 1 byte");
  if (bytes >= 9.2e18) throw bad("too large");
  const double whole = std::round(bytes);
  if (std::fabs(bytes - whole) > 1e-6 * std::max(1.0, whole)) throw bad("not a whole number of bytes");
  return static_cast<std::int64_t>(whole);
}

/// Parses --alpha: "auto" (nullopt: tuned online) or a number >= 0.
/// @throws hybridcache::invalid_argument otherwise.
[[nodiscard]] inline std::optional<double> parse_alpha(const std::string& s) {
  if (s == "auto") return std::nullopt;
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0) || !std::isfinite(v))
    throw hybridcache::invalid_argument("--alpha '" + s + "': expected 'auto' or a number >= 0");
  return v;
}

/// Parses --lru-ties: "reference" -> true, "node-id" -> false.
/// @throws hybridcache::invalid_argument otherwise.
[[nodiscard]] inline bool parse_lru_ties(std::string_view s) {
  if (s == "reference") return true;
  if (s == "node-id") return false;
  throw hybridcache::invalid_argument("--lru-ties '" + std::string(s) + "': expected reference or node-id");
}

/// Splits "a,b,c" into {"a","b","c"} (empty items dropped, whitespace trimmed).
[[nodiscard]] inline std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const std::size_t comma = s.find(',');
    const std::string_view item = detail::trim(s.substr(0, comma));
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

/// Formats a byte count compactly for tables: 500000000 -> "500MB", 4294967296 -> "4GiB".
[[nodiscard]] inline std::string format_bytes(std::int64_t b) {
  struct u {
    std::int64_t scale;
    const char* name;
  };
  static constexpr u units[] = {{1LL << 40, "TiB"}, {1000LL * 1000 * 1000 * 1000, "TB"}, {1LL << 30, "GiB"},
                                {1000LL * 1000 * 1000, "GB"}, {1LL << 20, "MiB"}, {1000 * 1000, "MB"},
                                {1LL << 10, "KiB"}, {1000, "kB"}};
  for (const auto& x : units)  // exact, in a unit that keeps the number short
    if (b >= x.scale && b % x.scale == 0 && b / x.scale < 10000) return std::to_string(b / x.scale) + x.name;
  for (const auto& x : units)  // not whole: one decimal of the largest decimal unit
    if (b >= x.scale && x.scale % 1000 == 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g%s", static_cast<double>(b) / static_cast<double>(x.scale), x.name);
      return buf;
    }
  return std::to_string(b) + "B";
}

}  // namespace hcbench
