// Argument parsing helpers shared by `hcbench replay` and `hcbench compare`.
//
// parse_capacity reads --capacity / --capacities in the library's one byte-size grammar
// (hybridcache/core/byte_size.hpp): "5e8", "500000000", "5GB" (10^9), "4GiB" (2^30),
// "512 MiB", "1.5e9B", "4.1GB" (exact); units B, KB MB GB TB PB (powers of 1000) and KiB MiB
// GiB TiB PiB (powers of 1024), case-insensitive. A capacity must be a positive whole number
// of bytes that fits in int64; anything else throws hybridcache::invalid_argument naming
// the text (a fraction of a byte is an error, never rounded).
#pragma once

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/core/byte_size.hpp>
#include <hybridcache/core/error.hpp>

namespace hcbench {

namespace detail {
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace detail

/// Parses a byte capacity such as `5e8`, `500000000`, `5GB`, `4GiB` (core/byte_size.hpp).
/// @throws hybridcache::invalid_argument naming `text` when it is not a positive whole
///         number of bytes representable in int64 (overflow_error when it is too large).
[[nodiscard]] inline std::int64_t parse_capacity(std::string_view text) {
  const std::int64_t bytes = hybridcache::parse_byte_size_or_throw(text, "capacity");
  if (bytes <= 0) throw hybridcache::invalid_argument("capacity '" + std::string(text) + "': must be > 0");
  return bytes;
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

/// --block-size's --help text (replay and compare): its defaults depend on the format and
/// the policy, so --help shows them here and no "=0".
inline constexpr const char* block_size_help =
    "tokens per block: a mooncake trace's engine block size, dividing 512 (default 512: one id per hash id), or "
    "on the other formats vllm+'s checkpoint block (default 32); an error elsewhere";

/// What --block-size sets, for the messages that refuse it where it does not apply.
inline constexpr const char* block_size_meaning = "it is a mooncake trace's engine block size, or vllm+'s checkpoint block";

/// The options only the chat formats read (replay and compare refuse them elsewhere).
inline constexpr std::array<const char*, 4> chat_only_options{"--chat-template", "--tool-time-mean",
                                                              "--collapse-observations", "--max-turns"};

/// Checks a --block-size given on the command line: a positive number of tokens (that it
/// divides 512 for mooncake, and is a compiled block for vllm+, is checked where it is used).
/// @throws hybridcache::invalid_argument naming the value.
inline void check_block_size(std::int64_t tokens) {
  if (tokens <= 0)
    throw hybridcache::invalid_argument("--block-size: expected a positive number of tokens, got " + std::to_string(tokens));
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

/// The unit family a size is printed in: the one the user wrote theirs in (docs/replay.md,
/// "Output conventions").
enum class byte_units { decimal, binary };

/// The family of a size as the user wrote it: binary when it names a power-of-1024 unit
/// ("128GiB", "hbm=64GiB,host=256GiB"), decimal otherwise ("5e8", "1GB").
[[nodiscard]] inline byte_units units_of(std::string_view text) {
  // A number, optional spaces, then K/M/G/T/P + "iB" (any case): not the "ib" of a path's "lib".
  auto is = [&](std::size_t i, std::string_view set) { return set.find(text[i]) != std::string_view::npos; };
  for (std::size_t i = 1; i + 2 < text.size(); ++i) {
    if (!is(i, "kKmMgGtTpP") || !is(i + 1, "iI") || !is(i + 2, "bB")) continue;
    std::size_t j = i;
    while (j > 0 && text[j - 1] == ' ') --j;
    if (j > 0 && is(j - 1, "0123456789.")) return byte_units::binary;
  }
  return byte_units::decimal;
}

/// A byte count for people (tables, text; JSON and CSV keep the exact bytes): a whole number
/// of a unit when one divides it, as a user would have typed it ("500 MB", "128 GiB"), else
/// three significant digits in `family` ("14.8 GB", "13.7 GiB"); below 1 KB, "512 B".
[[nodiscard]] inline std::string format_bytes(std::int64_t b, byte_units family = byte_units::decimal) {
  struct unit {
    std::int64_t scale;
    const char* name;
    bool binary;
  };
  static constexpr unit units[] = {{1LL << 50, "PiB", true}, {1000LL * 1000 * 1000 * 1000 * 1000, "PB", false},
                                   {1LL << 40, "TiB", true}, {1000LL * 1000 * 1000 * 1000, "TB", false},
                                   {1LL << 30, "GiB", true}, {1000LL * 1000 * 1000, "GB", false},
                                   {1LL << 20, "MiB", true}, {1000 * 1000, "MB", false},
                                   {1LL << 10, "KiB", true}, {1000, "KB", false}};
  for (const auto& u : units)  // exact, in a unit that keeps the number short
    if (b >= u.scale && b % u.scale == 0 && b / u.scale < 10000) return std::to_string(b / u.scale) + " " + u.name;
  const bool binary = family == byte_units::binary;
  for (std::size_t i = 0; i < std::size(units); ++i) {
    const unit& u = units[i];
    if (u.binary != binary || b < u.scale) continue;
    double v = static_cast<double>(b) / static_cast<double>(u.scale);
    const char* name = u.name;
    if (v >= 999.5 && i >= 2) {  // 999.5 MB or 1000..1023 MiB would print 4 digits: 1.00 GB, 0.98 GiB
      v /= binary ? 1024.0 : 1000.0;
      name = units[i - 2].name;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s", v, name);
    return buf;
  }
  return std::to_string(b) + " B";
}

}  // namespace hcbench
