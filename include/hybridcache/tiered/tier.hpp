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
#include "hybridcache/core/byte_size.hpp"
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

/// Parses the `--tiers` option: a comma-separated list of `kind=SIZE` with kind one of
/// `hbm`, `host`, `cxl` (optionally `host@NODE` / `cxl@NODE` to bind to a NUMA node), and
/// SIZE in the library's one byte-size grammar (core/byte_size.hpp: `64GiB`, `512MB`,
/// `1e9`, `4.1GB` read exactly; a fraction of a byte or a bare `4K` is an error). Every tier
/// below HBM gets `link_gbps`. The result is validated with `validate_tiers`.
///
/// @throws invalid_argument for an empty list, an unknown kind, a bad size, a zero size, a
///         size smaller than `page_bytes`, a zero or negative `link_gbps`, or hbm missing /
///         repeated / not first; overflow_error for a size beyond int64. The message names
///         the tier and the field.
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
    t.capacity_bytes = parse_byte_size_or_throw(item.substr(eq + 1), who + ": size");
    out.push_back(t);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  validate_tiers(out, page_bytes);
  return out;
}

}  // namespace hybridcache::tiered
