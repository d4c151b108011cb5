// hybridcache/tiered/tier.hpp
//
// Tier configuration for the multi-tier cache (CaR, papers/003): what a tier is (HBM, host
// DRAM, a CXL expander seen as a CPU-less NUMA node), how big it is, how fast it talks to
// HBM, and the parser for the `--tiers hbm=BYTES,host=BYTES` option string.
//
// Tier 0 is always HBM (the tier compute reads from); tiers 1.. are slower, in the order
// given. Every entry point validates its input and throws `invalid_argument` naming the
// offending tier and field: zero capacity, a capacity smaller than one page, a zero or
// negative link bandwidth, a duplicated or misplaced HBM tier.
//
// Costs: parsing is O(length of the string); nothing here is on a hot path.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache::tiered {

/// What kind of memory a tier is. Only the first tier may be `hbm`.
enum class tier_kind : std::uint8_t {
  hbm,   ///< device memory; the tier compute reads from
  host,  ///< host DRAM (pinned for DMA)
  cxl,   ///< a CXL memory expander: host memory on a CPU-less NUMA node
};

/// Name of a tier kind as it is spelled in option strings.
[[nodiscard]] constexpr std::string_view to_string(tier_kind k) noexcept {
  switch (k) {
    case tier_kind::hbm: return "hbm";
    case tier_kind::host: return "host";
    case tier_kind::cxl: return "cxl";
  }
  return "unknown";
}

/// One tier of the store. Aggregate: use designated initializers.
struct tier_config {
  tier_kind kind = tier_kind::host;
  std::int64_t capacity_bytes = 0;  ///< bytes of cache this tier may hold
  /// Bandwidth of the link between this tier and HBM, GB/s (10^9 B/s). Ignored for HBM.
  double link_gbps = 50.0;
  /// NUMA node to bind a host/CXL tier's memory to; -1 = no binding (first touch).
  int numa_node = -1;
};

/// Validates one tier against the page size; throws `invalid_argument` naming the tier.
inline void validate_tier(const tier_config& t, std::size_t index, std::int64_t page_bytes) {
  const std::string who = "tier " + std::to_string(index) + " (" + std::string(to_string(t.kind)) + ")";
  if (page_bytes <= 0) throw invalid_argument("tiers: page size must be > 0, got " + std::to_string(page_bytes));
  if (t.capacity_bytes <= 0)
    throw invalid_argument(who + ": field 'capacity_bytes' must be > 0, got " + std::to_string(t.capacity_bytes));
  if (t.capacity_bytes < page_bytes)
    throw invalid_argument(who + ": field 'capacity_bytes' (" + std::to_string(t.capacity_bytes) +
                           ") is smaller than one page (" + std::to_string(page_bytes) + " bytes)");
  if (t.kind != tier_kind::hbm && !(t.link_gbps > 0.0))
    throw invalid_argument(who + ": field 'link_gbps' must be > 0");
  if (t.numa_node < -1) throw invalid_argument(who + ": field 'numa_node' must be >= -1");
}

/// Validates a whole tier list: at least one tier, HBM first and only first, each tier valid.
inline void validate_tiers(const std::vector<tier_config>& tiers, std::int64_t page_bytes) {
  if (tiers.empty()) throw invalid_argument("tiers: at least one tier (hbm) is required");
  if (tiers.size() > std::numeric_limits<std::uint8_t>::max())
    throw invalid_argument("tiers: at most 255 tiers are supported");
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    if ((i == 0) != (tiers[i].kind == tier_kind::hbm))
      throw invalid_argument(i == 0 ? "tiers: the first tier must be hbm"
                                    : "tiers: tier " + std::to_string(i) + " is hbm; only the first tier may be hbm");
    validate_tier(tiers[i], i, page_bytes);
  }
}

namespace detail {
// Parses "123", "64GiB", "1.5GB", "512MiB", "4K" (decimal K/M/G/T, binary Ki/Mi/Gi/Ti, a
// trailing "B" optional), rounded to the nearest byte (halves up). Exact: the digits are
// combined as integers, since a binary double holds neither 4.1 nor 2.45 and truncating
// its product lost a byte ("4.1GB" gave 4099999999). Throws invalid_argument naming
// `what`; overflow_error when the size does not fit in int64.
inline std::int64_t parse_bytes(std::string_view s, const std::string& what) {
  if (s.empty()) throw invalid_argument(what + ": empty size");
  std::size_t i = 0, dot = std::string_view::npos;
  bool any_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') any_digit = true;
    else if (c == '.' && dot == std::string_view::npos) dot = i;
    else break;
  }
  if (!any_digit) throw invalid_argument(what + ": '" + std::string(s) + "' is not a size");
  const std::string_view whole = s.substr(0, dot == std::string_view::npos ? i : dot);
  const std::string_view fraction = dot == std::string_view::npos ? std::string_view{} : s.substr(dot + 1, i - dot - 1);
  std::string_view unit = s.substr(i);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.remove_suffix(1);
  std::int64_t mult = 1;
  if (!unit.empty()) {
    const bool binary = unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I');
    if (unit.size() != 1 && !binary) throw invalid_argument(what + ": unknown unit in '" + std::string(s) + "'");
    const std::int64_t base = binary ? 1024 : 1000;
    int power = 0;
    switch (unit[0]) {
      case 'k': case 'K': power = 1; break;
      case 'm': case 'M': power = 2; break;
      case 'g': case 'G': power = 3; break;
      case 't': case 'T': power = 4; break;
      default: throw invalid_argument(what + ": unknown unit in '" + std::string(s) + "'");
    }
    for (int p = 0; p < power; ++p) mult *= base;  // at most 2^40
  }
  const auto too_big = [&] { return overflow_error(what + ": '" + std::string(s) + "' does not fit in int64"); };
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  std::int64_t n = 0;
  for (const char c : whole) {
    const int d = c - '0';
    if (n > (max - d) / 10) throw too_big();
    n = n * 10 + d;
  }
  // The fraction 0.f1..fk times mult, rounded: Horner from the last digit over 2 · mult
  // with integer division gives floor(2 · value) exactly (floor((a + y) / 10) equals
  // floor((a + floor(y)) / 10) for integer a), and (floor(2v) + 1) / 2 rounds v to
  // nearest. Every step stays below 2 · mult <= 2^41, however many digits there are.
  std::int64_t twice = 0;
  for (auto it = fraction.rbegin(); it != fraction.rend(); ++it) twice = ((*it - '0') * 2 * mult + twice) / 10;
  const std::int64_t part = (twice + 1) / 2;
  if (n > (max - part) / mult) throw too_big();
  return n * mult + part;
}
}  // namespace detail

/// Parses the `--tiers` option: a comma-separated list of `kind=SIZE` with kind one of
/// `hbm`, `host`, `cxl` (optionally `host@NODE` / `cxl@NODE` to bind to a NUMA node), and
/// SIZE a byte count with an optional unit (`64GiB`, `512MB`, `4.1GB` read exactly, `1e9`
/// is not accepted). Every tier below HBM gets `link_gbps`. The result is validated with
/// `validate_tiers`.
///
/// @throws invalid_argument for an empty list, an unknown kind, a bad size, a zero size, a
///         size smaller than `page_bytes`, a zero or negative `link_gbps`, or hbm missing /
///         repeated / not first. The message names the tier and the field.
[[nodiscard]] inline std::vector<tier_config> parse_tiers(std::string_view spec, std::int64_t page_bytes,
                                                          double link_gbps = 50.0) {
  if (!(link_gbps > 0.0)) throw invalid_argument("tiers: link bandwidth must be > 0 GB/s");
  std::vector<tier_config> out;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    const std::size_t comma = spec.find(',', pos);
    const std::string_view item = spec.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    const std::string who = "tiers: item " + std::to_string(out.size()) + " '" + std::string(item) + "'";
    const std::size_t eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos) throw invalid_argument(who + ": expected kind=SIZE");
    std::string_view name = item.substr(0, eq);
    tier_config t;
    t.link_gbps = link_gbps;
    if (const std::size_t at = name.find('@'); at != std::string_view::npos) {
      const std::string_view node = name.substr(at + 1);
      if (node.empty() || node.size() > 4 || node.find_first_not_of("0123456789") != std::string_view::npos)
        throw invalid_argument(who + ": bad NUMA node '" + std::string(node) + "'");
      t.numa_node = std::stoi(std::string(node));
      name = name.substr(0, at);
    }
    if (name == "hbm") t.kind = tier_kind::hbm;
    else if (name == "host") t.kind = tier_kind::host;
    else if (name == "cxl") t.kind = tier_kind::cxl;
    else throw invalid_argument(who + ": unknown tier kind '" + std::string(name) + "' (hbm, host, cxl)");
    if (t.kind == tier_kind::hbm && t.numa_node != -1) throw invalid_argument(who + ": hbm cannot be bound to a NUMA node");
    t.capacity_bytes = detail::parse_bytes(item.substr(eq + 1), who);
    out.push_back(t);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  validate_tiers(out, page_bytes);
  return out;
}

}  // namespace hybridcache::tiered
