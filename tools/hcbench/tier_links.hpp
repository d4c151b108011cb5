// tools/hcbench/tier_links.hpp
//
// The link numbers of every tier below HBM of `hcbench replay --tiers`, and where each came
// from: given in the spec (`:gbps=` / `:lat_us=`), `--link-gbps` (host/cxl), or measured
// at start-up for disk and redis tiers that did not give them (sim/disk_probe.hpp,
// tiered/redis/redis_probe.hpp). A probe that fails (an unwritable directory, an
// unreachable Redis) is an error: a storage tier is never modelled with made-up numbers.
// Printed in the text table and as the JSON key `tier_links`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hybridcache/tiered/tier.hpp>

namespace hcbench {

/// One tier's link as the replay models it.
struct tier_link_row {
  std::size_t index = 0;
  hybridcache::tiered::tier_config tier;
  std::string gbps_source;     ///< "given", "--link-gbps", "measured"
  std::string latency_source;  ///< "given", "none" (memory tiers), "measured"
  // What a probe measured (0 when not run).
  double write_gbps = 0.0, read_gbps = 0.0;  ///< disk: sequential write / read
  double round_trip_us = 0.0;                ///< redis: PING median
  double set_gbps = 0.0, get_gbps = 0.0;     ///< redis: SET / GET of a few MB
  std::int64_t probe_bytes = 0;
  std::string method;                        ///< disk: O_DIRECT or buffered; redis: "PING+SET/GET"
};

/// Measures the storage tiers of `tiers` (index >= 1) whose spec gave no bandwidth or
/// latency, writes the numbers into them, and returns one row per tier below HBM. A disk
/// tier's link is min(read, write) GB/s and the median 4 KiB read latency; a redis tier's
/// min(SET, GET) GB/s and the median PING round trip.
/// @throws hybridcache::error naming the tier when a probe fails, or when a redis tier
///         needs a probe and hcbench was built without hiredis.
std::vector<tier_link_row> measure_tier_links(std::vector<hybridcache::tiered::tier_config>& tiers,
                                              bool link_gbps_flag_applies);

/// The rows as a JSON array (the `tier_links` key).
std::string tier_links_json(const std::vector<tier_link_row>& rows);

/// Prints the rows as a table (text mode).
void print_tier_links(const std::vector<tier_link_row>& rows);

}  // namespace hcbench
