// hybridcache/tiered/redis/redis_probe.hpp
//
// `probe_redis`: measures, at start-up, the link numbers of a redis tier (tiered/tier.hpp
// `redis@HOST:PORT`) that its spec did not give: the round trip of one request (median of
// `pings` PINGs) and the GB/s of SET and GET of a `value_bytes` value (several MB, as one
// hybrid model's checkpoint), each the median of `rounds`. The timed replay then models
// the tier with them (sim/timed_copy_engine.hpp). OPT-IN: needs hiredis (target
// hybridcache::redis).
//
// The probe writes one key (`probe_key`, a name no tier value takes: values are keyed
// `hc:` + the storage key, tiered/storage_format.hpp) and deletes it. A server that cannot
// be reached, or answers an error, is an exception naming the endpoint: a tier that cannot
// be measured is never given made-up numbers.
//
// Costs: `pings` + 2 x `rounds` round trips and 2 x rounds x value_bytes over the wire.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache::tiered {

/// Options of `probe_redis`. Aggregate with defaults.
struct redis_probe_options {
  int pings = 20;                                     ///< PINGs for the round-trip median
  int rounds = 5;                                     ///< SET/GET pairs for the GB/s medians
  std::int64_t value_bytes = std::int64_t{4} << 20;   ///< bytes of the probe value
  std::chrono::milliseconds timeout{2000};            ///< connect and I/O timeout
  std::string probe_key = "hybridcache:probe";
};

/// What `probe_redis` measured.
struct redis_probe_result {
  double round_trip_us = 0.0;  ///< median PING round trip
  double set_gbps = 0.0;       ///< median SET of value_bytes, GB/s (the round trip subtracted)
  double get_gbps = 0.0;       ///< median GET of value_bytes, GB/s (the round trip subtracted)
  std::int64_t value_bytes = 0;
};

/// Measures the Redis server at `host_port` ("HOST:PORT").
/// @throws invalid_argument for a malformed endpoint or options; error naming the endpoint
///         when the server cannot be reached, times out or answers an error.
[[nodiscard]] inline redis_probe_result probe_redis(const std::string& host_port, redis_probe_options o = {}) {
  const std::size_t colon = host_port.rfind(':');
  HYBRIDCACHE_EXPECTS(colon != std::string::npos && colon > 0 && colon + 1 < host_port.size(), invalid_argument,
                      "redis probe: expected HOST:PORT, got '" + host_port + "'");
  HYBRIDCACHE_EXPECTS(o.pings >= 1 && o.rounds >= 1 && o.value_bytes >= 1, invalid_argument,
                      "redis probe: pings, rounds and value_bytes must be >= 1");
  const std::string host = host_port.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(host_port.substr(colon + 1));
  } catch (const std::exception&) {
    port = 0;
  }
  HYBRIDCACHE_EXPECTS(port >= 1 && port <= 65535, invalid_argument, "redis probe: bad port in '" + host_port + "'");
  const std::string who = "redis probe of " + host_port;
  const auto ms = o.timeout.count();
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  std::unique_ptr<redisContext, decltype(&redisFree)> ctx(redisConnectWithTimeout(host.c_str(), port, tv), &redisFree);
  if (!ctx || ctx->err != 0)
    throw error(who + ": cannot connect (" + (ctx ? std::string(ctx->errstr) : std::string("out of memory")) + ")");
  if (redisSetTimeout(ctx.get(), tv) != REDIS_OK) throw error(who + ": cannot set the timeout");

  using reply_ptr = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;
  const auto call = [&](std::initializer_list<std::string_view> args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto a : args) argv.push_back(a.data()), lens.push_back(a.size());
    reply_ptr r(static_cast<redisReply*>(redisCommandArgv(ctx.get(), static_cast<int>(argv.size()), argv.data(),
                                                          lens.data())),
                &freeReplyObject);
    if (!r) throw error(who + ": no reply (" + std::string(ctx->errstr) + ")");
    if (r->type == REDIS_REPLY_ERROR) throw error(who + ": server error: " + std::string(r->str, r->len));
    return r;
  };
  using clock = std::chrono::steady_clock;
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };

  redis_probe_result r;
  r.value_bytes = o.value_bytes;
  std::vector<double> t;
  for (int i = 0; i < o.pings; ++i) {
    const auto a = clock::now();
    (void)call({"PING"});
    t.push_back(std::chrono::duration<double, std::micro>(clock::now() - a).count());
  }
  r.round_trip_us = median(t);
  // Not zeros: a byte pattern.
  std::string value(static_cast<std::size_t>(o.value_bytes), '\0');
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>((i * 131 + 7) & 0xff);
  std::vector<double> set_s, get_s;
  for (int i = 0; i < o.rounds; ++i) {
    auto a = clock::now();
    (void)call({"SET", o.probe_key, value});
    set_s.push_back(std::chrono::duration<double>(clock::now() - a).count());
    a = clock::now();
    const reply_ptr g = call({"GET", o.probe_key});
    get_s.push_back(std::chrono::duration<double>(clock::now() - a).count());
    if (g->type != REDIS_REPLY_STRING || std::string_view(g->str, g->len) != value)
      throw error(who + ": GET did not return the value just SET");
  }
  (void)call({"DEL", o.probe_key});
  // The model adds the latency to every copy (sim/timed_copy_engine.hpp): the bandwidth is
  // the rest of the time.
  const double gb = static_cast<double>(o.value_bytes) / 1e9, rtt_s = r.round_trip_us / 1e6;
  r.set_gbps = gb / std::max(median(set_s) - rtt_s, 1e-9);
  r.get_gbps = gb / std::max(median(get_s) - rtt_s, 1e-9);
  return r;
}

}  // namespace hybridcache::tiered
