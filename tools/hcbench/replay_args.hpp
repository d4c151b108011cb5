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
