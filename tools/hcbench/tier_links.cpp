// Link numbers of the tiers of `hcbench replay --tiers`: see tier_links.hpp.
#include "tier_links.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/disk_probe.hpp>
#if HCBENCH_HAS_REDIS
#include <hybridcache/tiered/redis/redis_probe.hpp>
#endif

#include "cli_support.hpp"

namespace hcbench {

namespace hc = hybridcache;
namespace tr = hybridcache::tiered;

std::vector<tier_link_row> measure_tier_links(std::vector<tr::tier_config>& tiers, bool link_gbps_flag_applies) {
  std::vector<tier_link_row> rows;
  for (std::size_t i = 1; i < tiers.size(); ++i) {
    tr::tier_config& t = tiers[i];
    tier_link_row row;
    row.index = i;
    const std::string who = "tier " + std::to_string(i) + " (" + std::string(to_string(t.kind)) + "@" + t.location + ")";
    if (t.kind == tr::tier_kind::disk && !(t.link_gbps_given && t.latency_given)) {
      hc::sim::disk_probe_result p;
      try {
        p = hc::sim::probe_disk(t.location);
      } catch (const std::exception& e) {
        throw hc::error(who + ": cannot measure the disk (give :gbps= and :lat_us= to skip the probe): " + strip_library_prefix(e.what()));
      }
      if (!t.link_gbps_given) t.link_gbps = std::min(p.read_gbps, p.write_gbps);
      if (!t.latency_given) t.latency_us = p.latency_us;
      row.write_gbps = p.write_gbps;
      row.read_gbps = p.read_gbps;
      row.probe_bytes = p.bytes;
      row.method = p.method;
    } else if (t.kind == tr::tier_kind::redis && !(t.link_gbps_given && t.latency_given)) {
#if HCBENCH_HAS_REDIS
      tr::redis_probe_result p;
      try {
        p = tr::probe_redis(t.location);
      } catch (const std::exception& e) {
        throw hc::error(who + ": cannot measure the server (give :gbps= and :lat_us= to skip the probe): " + strip_library_prefix(e.what()));
      }
      if (!t.link_gbps_given) t.link_gbps = std::min(p.set_gbps, p.get_gbps);
      if (!t.latency_given) t.latency_us = p.round_trip_us;
      row.round_trip_us = p.round_trip_us;
      row.set_gbps = p.set_gbps;
      row.get_gbps = p.get_gbps;
      row.probe_bytes = p.value_bytes;
      row.method = "PING+SET/GET";
#else
      throw hc::error(who + ": this hcbench was built without hiredis and cannot measure the server; give "
                      ":gbps= and :lat_us=");
#endif
    }
    const bool storage = tr::is_storage(t.kind);
    row.gbps_source = t.link_gbps_given ? "given" : storage ? "measured" : link_gbps_flag_applies ? "--link-gbps" : "default";
    row.latency_source = t.latency_given ? "given" : storage ? "measured" : "none";
    row.tier = t;
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string tier_links_json(const std::vector<tier_link_row>& rows) {
  std::string out = "[";
  for (const auto& r : rows) {
    json::object o;
    o.integer("tier", static_cast<std::int64_t>(r.index)).str("kind", to_string(r.tier.kind));
    o.str("location", r.tier.location).integer("capacity_bytes", r.tier.capacity_bytes);
    o.num("link_gbps", r.tier.link_gbps).str("link_gbps_source", r.gbps_source);
    o.num("latency_us", r.tier.latency_us).str("latency_source", r.latency_source);
    if (r.tier.kind == tr::tier_kind::disk && !r.method.empty())
      o.num("probe_write_gbps", r.write_gbps).num("probe_read_gbps", r.read_gbps).str("probe_method", r.method);
    if (r.tier.kind == tr::tier_kind::redis && !r.method.empty())
      o.num("probe_round_trip_us", r.round_trip_us).num("probe_set_gbps", r.set_gbps).num("probe_get_gbps", r.get_gbps);
    if (!r.method.empty()) o.integer("probe_bytes", r.probe_bytes);
    if (out.size() > 1) out += ", ";
    out += o.text();
  }
  return out + "]";
}

void print_tier_links(const std::vector<tier_link_row>& rows) {
  if (rows.empty()) return;
  std::printf("%-5s %-6s %-24s %10s %-11s %10s %-9s %s\n", "tier", "kind", "location", "GB/s", "(source)", "lat us",
              "(source)", "probe");
  for (const auto& r : rows) {
    std::string probe;
    char b[160];
    if (r.tier.kind == tr::tier_kind::disk && !r.method.empty()) {
      std::snprintf(b, sizeof b, "write %.2f GB/s, read %.2f GB/s, %lld MiB, %s", r.write_gbps, r.read_gbps,
                    static_cast<long long>(r.probe_bytes >> 20), r.method.c_str());
      probe = b;
    } else if (r.tier.kind == tr::tier_kind::redis && !r.method.empty()) {
      std::snprintf(b, sizeof b, "PING %.0f us, SET %.2f GB/s, GET %.2f GB/s of %lld MiB", r.round_trip_us, r.set_gbps,
                    r.get_gbps, static_cast<long long>(r.probe_bytes >> 20));
      probe = b;
    }
    std::printf("%-5zu %-6s %-24s %10.3g %-11s %10.3g %-9s %s\n", r.index, std::string(to_string(r.tier.kind)).c_str(),
                r.tier.location.empty() ? "-" : r.tier.location.c_str(), r.tier.link_gbps, r.gbps_source.c_str(),
                r.tier.latency_us, r.latency_source.c_str(), probe.c_str());
  }
  std::printf("\n");
}

}  // namespace hcbench
