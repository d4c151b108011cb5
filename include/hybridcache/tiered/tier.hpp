// hybridcache/tiered/tier.hpp
//
// Tier configuration for the multi-tier cache (CaR, papers/003): what a tier is (HBM, host
// DRAM, a CXL expander seen as a CPU-less NUMA node, a local disk directory, a Redis
// server), how big it is, how fast it talks to HBM, and the parser for the
// `--tiers hbm=BYTES,host=BYTES,disk@PATH=BYTES,redis@HOST:PORT=BYTES` option string.
//
// Tier 0 is always HBM (the tier compute reads from); tiers 1.. are slower, in the order
// given: the kinds must go hbm, then host/cxl (either order), then disk, then redis
// (`tier_rank`); the link numbers themselves are not compared (a measured disk may beat a
// configured CXL link). Every entry point validates its input and throws
// `invalid_argument` naming the offending tier and field: zero capacity, a capacity smaller
// than one page, a zero or negative link bandwidth, a negative latency, a duplicated or
// misplaced HBM tier, tiers out of order, a storage tier without its location.
//
// Costs: parsing is O(length of the string); nothing here is on a hot path.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/byte_count.hpp"
#include "hybridcache/core/byte_size.hpp"
#include "hybridcache/core/enum_names.hpp"
#include "hybridcache/core/error.hpp"

namespace hybridcache::tiered {

/// What kind of memory a tier is. Only the first tier may be `hbm`.
enum class tier_kind : std::uint8_t {
  hbm,    ///< device memory; the tier compute reads from
  host,   ///< host DRAM (pinned for DMA)
  cxl,    ///< a CXL memory expander: host memory on a CPU-less NUMA node
  disk,   ///< a directory on a local file system (tiered/disk_backend.hpp)
  redis,  ///< a Redis (or Valkey) server, shared by nodes (tiered/redis/redis_backend.hpp)
};

/// Name of a tier kind as it is spelled in option strings.
[[nodiscard]] constexpr std::string_view to_string(tier_kind k) noexcept {
  constexpr std::array<std::string_view, 5> names{"hbm", "host", "cxl", "disk", "redis"};
  static_assert(names_every_enumerator(names, tier_kind::redis));
  return enum_name(k, names);
}

/// True for the tiers that are not byte-addressable memory (a storage backend holds them).
[[nodiscard]] constexpr bool is_storage(tier_kind k) noexcept { return k == tier_kind::disk || k == tier_kind::redis; }

/// Speed class of a kind, fastest first: hbm 0, host and cxl 1, disk 2, redis 3. A tier
/// list must not go down in rank (`validate_tiers`).
[[nodiscard]] constexpr int tier_rank(tier_kind k) noexcept {
  switch (k) {
    case tier_kind::hbm: return 0;
    case tier_kind::host:
    case tier_kind::cxl: return 1;
    case tier_kind::disk: return 2;
    case tier_kind::redis: return 3;
  }
  return 4;
}

/// Link numbers a storage tier gets when the spec names none and nobody measured them
/// (a tool measures them at start-up: sim/tier_probe.hpp). A NVMe-class disk and a Redis
/// server one network hop away.
inline constexpr double default_disk_link_gbps = 2.0;
inline constexpr double default_disk_latency_us = 100.0;
inline constexpr double default_redis_link_gbps = 1.0;
inline constexpr double default_redis_latency_us = 200.0;

/// One tier of the store. Aggregate: use designated initializers.
struct tier_config {
  tier_kind kind = tier_kind::host;
  byte_count capacity_bytes = 0;  ///< bytes of cache this tier may hold (its budget)
  /// Bandwidth of the link between this tier and HBM, GB/s (10^9 B/s). Ignored for HBM.
  double link_gbps = 50.0;
  /// NUMA node to bind a host/CXL tier's memory to; -1 = no binding (first touch).
  int numa_node = -1;
  /// Fixed time of one request to this tier, µs (a disk access, a network round trip),
  /// paid once per copied entry on top of bytes / link_gbps. Ignored for HBM.
  double latency_us = 0.0;
  /// Where a storage tier lives: the directory of a disk tier, `HOST:PORT` of a redis
  /// tier. Empty for the memory tiers.
  std::string location{};
  /// Whether `link_gbps` / `latency_us` were given by the user (`:gbps=` / `:lat_us=`);
  /// the ones not given may be measured at start-up (sim/tier_probe.hpp) or defaulted.
  bool link_gbps_given = false;
  bool latency_given = false;
};

/// A redis tier's server: `location` split into its host and port.
struct redis_host_port {
  std::string host;
  int port = 0;
};

/// Splits `HOST:PORT` (a non-empty host, a port in 1..65535; the last colon separates them,
/// so an IPv6 host keeps its own); throws `invalid_argument` beginning with `who` otherwise.
/// Every reader of a redis location goes through this one check. O(|ep|).
[[nodiscard]] inline redis_host_port parse_redis_endpoint(std::string_view ep, const std::string& who) {
  const std::size_t colon = ep.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    throw invalid_argument(who + ": redis needs HOST:PORT, got '" + std::string(ep) + "'");
  const std::string_view port = ep.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
      std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)
    throw invalid_argument(who + ": bad redis port '" + std::string(port) + "' (1..65535)");
  return {std::string(ep.substr(0, colon)), std::stoi(std::string(port))};
}

/// Validates one tier against the page size; throws `invalid_argument` naming the tier.
inline void validate_tier(const tier_config& t, std::size_t index, std::int64_t page_bytes) {
  const std::string who = "tier " + std::to_string(index) + " (" + std::string(to_string(t.kind)) + ")";
  if (page_bytes <= 0) throw invalid_argument("tiers: page size must be > 0, got " + std::to_string(page_bytes));
  if (t.capacity_bytes <= 0)
    throw invalid_argument(who + ": field 'capacity_bytes' must be > 0, got " + std::to_string(t.capacity_bytes));
  if (t.capacity_bytes < page_bytes)
    throw invalid_argument(who + ": field 'capacity_bytes' (" + std::to_string(t.capacity_bytes) +
                           ") is smaller than one page (" + std::to_string(page_bytes) + " bytes)");
  if (t.kind != tier_kind::hbm && !(t.link_gbps > 0.0 && t.link_gbps < std::numeric_limits<double>::infinity()))
    throw invalid_argument(who + ": field 'link_gbps' must be > 0 and finite");
  if (!(t.latency_us >= 0.0 && t.latency_us < std::numeric_limits<double>::infinity()))
    throw invalid_argument(who + ": field 'latency_us' must be >= 0 and finite");
  if (t.numa_node < -1) throw invalid_argument(who + ": field 'numa_node' must be >= -1");
  if (is_storage(t.kind) && t.location.empty())
    throw invalid_argument(who + ": field 'location' (the " +
                           std::string(t.kind == tier_kind::disk ? "directory" : "HOST:PORT") + ") is required");
  if (!is_storage(t.kind) && !t.location.empty())
    throw invalid_argument(who + ": field 'location' is only for disk and redis tiers");
  if (t.kind == tier_kind::redis) (void)parse_redis_endpoint(t.location, who + ": field 'location'");
  if (is_storage(t.kind) && t.numa_node != -1)
    throw invalid_argument(who + ": field 'numa_node' is only for host and cxl tiers");
}

/// Validates a whole tier list: at least one tier, HBM first and only first, kinds from
/// fastest to slowest (`tier_rank`: hbm, host/cxl, disk, redis), each tier valid.
inline void validate_tiers(const std::vector<tier_config>& tiers, std::int64_t page_bytes) {
  if (tiers.empty()) throw invalid_argument("tiers: at least one tier (hbm) is required");
  if (tiers.size() > std::numeric_limits<std::uint8_t>::max())
    throw invalid_argument("tiers: at most 255 tiers are supported");
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    if ((i == 0) != (tiers[i].kind == tier_kind::hbm))
      throw invalid_argument(i == 0 ? "tiers: the first tier must be hbm"
                                    : "tiers: tier " + std::to_string(i) + " is hbm; only the first tier may be hbm");
    if (i > 0 && tier_rank(tiers[i].kind) < tier_rank(tiers[i - 1].kind))
      throw invalid_argument("tiers: tier " + std::to_string(i) + " (" + std::string(to_string(tiers[i].kind)) +
                             ") comes after a slower " + std::string(to_string(tiers[i - 1].kind)) +
                             " tier; list tiers fastest first: hbm, host/cxl, disk, redis");
    validate_tier(tiers[i], i, page_bytes);
  }
}

namespace detail {

// A number of a per-tier override (`gbps=2.5`): the whole text, finite.
inline double parse_tier_number(std::string_view text, const std::string& who) {
  std::string s(text);
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !(v > -std::numeric_limits<double>::infinity() &&
                                         v < std::numeric_limits<double>::infinity()))
    throw invalid_argument(who + " '" + s + "' is not a number");
  return v;
}

}  // namespace detail

/// Parses the `--tiers` option: a comma-separated list of items
///
///   KIND[@WHERE]=SIZE[:gbps=G][:lat_us=L]
///
/// KIND is `hbm`, `host`, `cxl` (WHERE: an optional NUMA node, `host@1`), `disk` (WHERE: the
/// directory, required; no ',' or '=' in it) or `redis` (WHERE: `HOST:PORT`, required).
/// SIZE is in the library's one byte-size grammar (core/byte_size.hpp: `64GiB`, `512MB`,
/// `1e9`, `4.1GB` read exactly; a fraction of a byte or a bare `4K` is an error). The
/// overrides set that tier's link bandwidth (GB/s, > 0) and per-request latency (µs, >= 0)
/// and mark them given; not allowed on hbm. Without them a host/cxl tier gets `link_gbps`
/// and no latency, a disk or redis tier the `default_*` numbers (to be measured by a tool).
/// Example: `hbm=40GiB,host=200GiB,disk@/mnt/nvme=1TiB:gbps=2.5:lat_us=80,redis@10.0.0.5:6379=4TiB`.
/// The result is validated with `validate_tiers` (order included).
///
/// @throws invalid_argument for an empty list, an unknown kind, a bad size, a zero size, a
///         size smaller than `page_bytes`, a zero or negative `link_gbps`, a bad override,
///         a disk/redis tier without its location, tiers out of order, or hbm missing /
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
    std::string_view where;
    const bool has_where = name.find('@') != std::string_view::npos;
    if (has_where) {
      where = name.substr(name.find('@') + 1);
      name = name.substr(0, name.find('@'));
    }
    tier_config t;
    if (name == "hbm") t.kind = tier_kind::hbm;
    else if (name == "host") t.kind = tier_kind::host;
    else if (name == "cxl") t.kind = tier_kind::cxl;
    else if (name == "disk") t.kind = tier_kind::disk;
    else if (name == "redis") t.kind = tier_kind::redis;
    else throw invalid_argument(who + ": unknown tier kind '" + std::string(name) + "' (hbm, host, cxl, disk, redis)");
    if (t.kind == tier_kind::disk) {
      if (where.empty()) throw invalid_argument(who + ": a disk tier needs its directory: disk@PATH=SIZE");
      t.location = std::string(where);
      t.link_gbps = default_disk_link_gbps;
      t.latency_us = default_disk_latency_us;
    } else if (t.kind == tier_kind::redis) {
      if (where.empty()) throw invalid_argument(who + ": a redis tier needs its server: redis@HOST:PORT=SIZE");
      (void)parse_redis_endpoint(where, who);
      t.location = std::string(where);
      t.link_gbps = default_redis_link_gbps;
      t.latency_us = default_redis_latency_us;
    } else {
      t.link_gbps = link_gbps;
      if (has_where) {
        if (where.empty() || where.size() > 4 || where.find_first_not_of("0123456789") != std::string_view::npos)
          throw invalid_argument(who + ": bad NUMA node '" + std::string(where) + "'");
        t.numa_node = std::stoi(std::string(where));
      }
      if (t.kind == tier_kind::hbm && t.numa_node != -1)
        throw invalid_argument(who + ": hbm cannot be bound to a NUMA node");
    }
    // SIZE, then the overrides.
    std::string_view rest = item.substr(eq + 1);
    std::size_t colon = rest.find(':');
    t.capacity_bytes = parse_byte_size_or_throw(rest.substr(0, colon), who + ": size");
    while (colon != std::string_view::npos) {
      rest = rest.substr(colon + 1);
      colon = rest.find(':');
      const std::string_view opt = rest.substr(0, colon);
      const std::size_t oeq = opt.find('=');
      const std::string_view key = opt.substr(0, oeq);
      if (oeq == std::string_view::npos || (key != "gbps" && key != "lat_us"))
        throw invalid_argument(who + ": bad override '" + std::string(opt) + "' (gbps=G, lat_us=L)");
      if (t.kind == tier_kind::hbm) throw invalid_argument(who + ": hbm has no link to override");
      const double v = detail::parse_tier_number(opt.substr(oeq + 1), who + ": " + std::string(key));
      if (key == "gbps") {
        if (t.link_gbps_given) throw invalid_argument(who + ": gbps given twice");
        if (!(v > 0.0)) throw invalid_argument(who + ": gbps must be > 0");
        t.link_gbps = v;
        t.link_gbps_given = true;
      } else {
        if (t.latency_given) throw invalid_argument(who + ": lat_us given twice");
        if (!(v >= 0.0)) throw invalid_argument(who + ": lat_us must be >= 0");
        t.latency_us = v;
        t.latency_given = true;
      }
    }
    out.push_back(std::move(t));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  validate_tiers(out, page_bytes);
  return out;
}

}  // namespace hybridcache::tiered
