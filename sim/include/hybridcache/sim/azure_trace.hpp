// hybridcache/sim/azure_trace.hpp
//
// Reader for the Azure LLM inference traces (Azure/AzurePublicDataset, 2023; Splitwise,
// ISCA 2024): CSV with a header naming at least
//
//   TIMESTAMP,ContextTokens,GeneratedTokens
//   2023-11-16 18:15:46.6805900,374,44
//
// (columns found by name, in any order, extra columns ignored). TIMESTAMP is wall-clock
// `YYYY-MM-DD HH:MM:SS[.fraction]` (up to 9 fractional digits; the 2023 traces give 7, i.e.
// 100 ns) or a plain number of seconds. Arrivals are relative to the first row, computed in
// integer nanoseconds before the one conversion to double, so 100-ns steps survive an
// hour-long trace. The traces carry lengths only: requests have `input_tokens` and
// `output_tokens` and no ids (for allocator replays, not hit rates).
// Rows must be in non-decreasing time order; malformed rows throw `format_error` with the
// line and the column name.
// Cost: O(line bytes) per request, no allocation.
#pragma once

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <string_view>
#include <system_error>

#include "hybridcache/core/error.hpp"
#include "hybridcache/sim/line_reader.hpp"
#include "hybridcache/sim/request.hpp"

namespace hybridcache::sim {

namespace detail {

// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (Howard Hinnant's
// days_from_civil algorithm, written out from its published derivation).
[[nodiscard]] constexpr std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// Parses a fixed-width unsigned field; false unless every character is a digit.
[[nodiscard]] inline bool parse_digits(std::string_view s, std::int64_t& out) noexcept {
  if (s.empty()) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return true;
}

// "YYYY-MM-DD HH:MM:SS[.f{1,9}]" (or 'T' as separator) -> ns since the epoch; or a plain
// decimal number of seconds. False when malformed.
[[nodiscard]] inline bool parse_timestamp_ns(std::string_view s, std::int64_t& ns) noexcept {
  if (s.size() >= 19 && s[4] == '-' && s[7] == '-' && (s[10] == ' ' || s[10] == 'T') && s[13] == ':' && s[16] == ':') {
    std::int64_t y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
    if (!parse_digits(s.substr(0, 4), y) || !parse_digits(s.substr(5, 2), mo) || !parse_digits(s.substr(8, 2), d) ||
        !parse_digits(s.substr(11, 2), h) || !parse_digits(s.substr(14, 2), mi) || !parse_digits(s.substr(17, 2), sec))
      return false;
    // Years 1970..2200 keep nanoseconds since the epoch well inside int64 (+-292 years).
    if (y < 1970 || y > 2200 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return false;
    std::int64_t fraction_ns = 0;
    if (s.size() > 19) {
      const std::string_view frac = s.substr(20);
      if (s[19] != '.' || frac.empty() || frac.size() > 9) return false;
      if (!parse_digits(frac, fraction_ns)) return false;
      for (std::size_t k = frac.size(); k < 9; ++k) fraction_ns *= 10;
    }
    const std::int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
    ns = ((days * 24 + h) * 60 + mi) * 60 + sec;
    ns = ns * 1'000'000'000 + fraction_ns;
    return true;
  }
  double seconds = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), seconds);
  if (ec != std::errc{} || ptr != s.data() + s.size() || !(seconds >= 0) || seconds > 9e9) return false;
  ns = static_cast<std::int64_t>(seconds * 1e9);
  return true;
}

}  // namespace detail

/// Streaming reader of Azure-style CSV traces. Models `request_source`.
class azure_reader {
 public:
  /// Reads from `in` (which must outlive the reader).
  explicit azure_reader(std::istream& in) : lines_(in) {}
  /// Opens `path`; throws `invalid_argument` if it cannot be opened.
  explicit azure_reader(const std::filesystem::path& path) : lines_(path) {}

  /// Reads the next row into `r`; false at the end of the file.
  bool next(request& r) {
    std::string_view line;
    if (!lines_.next_nonblank(line)) {
      if (!have_header_) throw format_error(lines_.line_number(), "", "empty file: expected a header TIMESTAMP,ContextTokens,GeneratedTokens");
      return false;
    }
    if (!have_header_) {
      read_header(line);
      return next(r);
    }
    const std::int64_t line_no = lines_.line_number();
    std::string_view cells[3];
    bool found[3] = {false, false, false};
    std::size_t start = 0;
    for (int index = 0;; ++index) {
      const std::size_t comma = line.find(',', start);
      const std::string_view cell = line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      for (int k = 0; k < 3; ++k)
        if (columns_[k] == index) {
          cells[k] = cell;
          found[k] = true;
        }
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    for (int k = 0; k < 3; ++k)
      if (!found[k]) throw format_error(line_no, names[k], "missing column");
    std::int64_t ns = 0;
    if (!detail::parse_timestamp_ns(trim(cells[0]), ns))
      throw format_error(line_no, names[0], "expected YYYY-MM-DD HH:MM:SS[.fraction] (years 1970-2200) or seconds in [0, 9e9], got '" + std::string(cells[0]) + "'");
    if (!have_first_) {
      first_ns_ = ns;
      have_first_ = true;
    }
    if (ns < last_ns_) throw format_error(line_no, names[0], "timestamps go backwards");
    last_ns_ = ns;
    r.input.clear();
    r.output.clear();
    r.input_tokens = parse_count(cells[1], line_no, names[1]);
    r.output_tokens = parse_count(cells[2], line_no, names[2]);
    r.arrival_s = static_cast<double>(ns - first_ns_) / 1e9;  // both within 1970..2200: no overflow
    r.session_id = -1;
    r.turn_id = -1;
    r.tokens_per_id = 1;
    r.source_line = line_no;
    return true;
  }

 public:
  /// 1-based line of the row last read.
  [[nodiscard]] std::int64_t line_number() const noexcept { return lines_.line_number(); }

 private:
  static constexpr const char* names[3] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};

  static std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '"')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '"' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  }

  static std::int64_t parse_count(std::string_view cell, std::int64_t line, const char* name) {
    const std::string_view s = trim(cell);
    std::int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size() || v < 0 || v > max_request_tokens)
      throw format_error(line, name, "expected a token count in [0, " + std::to_string(max_request_tokens) + "], got '" +
                                         std::string(cell) + "'");
    return v;
  }

  void read_header(std::string_view line) {
    const std::int64_t line_no = lines_.line_number();
    std::size_t start = 0;
    for (int index = 0;; ++index) {
      const std::size_t comma = line.find(',', start);
      const std::string_view cell = trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      for (int k = 0; k < 3; ++k)
        if (cell == names[k]) columns_[k] = index;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    for (int k = 0; k < 3; ++k)
      if (columns_[k] < 0) throw format_error(line_no, names[k], "header has no such column (expected TIMESTAMP,ContextTokens,GeneratedTokens)");
    have_header_ = true;
  }

  line_reader lines_;
  bool have_header_ = false;
  int columns_[3] = {-1, -1, -1};
  bool have_first_ = false;
  std::int64_t first_ns_ = 0;
  std::int64_t last_ns_ = 0;
};
static_assert(request_source<azure_reader>);

}  // namespace hybridcache::sim
