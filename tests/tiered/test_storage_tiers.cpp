// Storage tiers in the tier spec and the timed replay (issue 16 item 5): `disk@PATH=SIZE`
// and `redis@HOST:PORT=SIZE` with per-tier `:gbps=` / `:lat_us=` overrides (tiered/tier.hpp),
// the fastest-first order, and the timed copy engine's model of a copy between two tiers
// (sim/timed_copy_engine.hpp): bytes over the slower link plus both ends' latency.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/sim/tiered_replay.hpp"
#include "hybridcache/sim/timed_copy_engine.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "hybridcache/tiered/tiered_store.hpp"
#include "real_bytes_support.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;
using namespace hybridcache::sim;

namespace {

std::string error_of(const char* spec, std::int64_t page = 4096) {
  try {
    (void)parse_tiers(spec, page);
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("parse_tiers reads disk and redis tiers with their locations and overrides") {
  const auto t = parse_tiers("hbm=16GiB,host=64GiB:gbps=25,disk@/mnt/nvme=1TiB:gbps=2.5:lat_us=80,"
                             "redis@10.0.0.5:6379=4TiB:lat_us=350",
                             4096, 40.0);
  REQUIRE(t.size() == 4);
  CHECK(t[1].kind == tier_kind::host);
  CHECK(t[1].link_gbps == 25.0);
  CHECK(t[1].link_gbps_given);
  CHECK_FALSE(t[1].latency_given);
  CHECK(t[1].latency_us == 0.0);
  CHECK(t[2].kind == tier_kind::disk);
  CHECK(t[2].location == "/mnt/nvme");
  CHECK(t[2].capacity_bytes == std::int64_t{1} << 40);
  CHECK(t[2].link_gbps == 2.5);
  CHECK(t[2].latency_us == 80.0);
  CHECK((t[2].link_gbps_given && t[2].latency_given));
  CHECK(t[3].kind == tier_kind::redis);
  CHECK(t[3].location == "10.0.0.5:6379");
  CHECK(t[3].latency_us == 350.0);
  CHECK_FALSE(t[3].link_gbps_given);
  CHECK(t[3].link_gbps == default_redis_link_gbps);  // not given: the default, a tool may measure it
  // Without overrides: memory tiers take the --link-gbps argument, storage tiers their defaults.
  const auto d = parse_tiers("hbm=1GiB,cxl=2GiB,disk@rel/dir=8GiB", 4096, 30.0);
  CHECK(d[1].link_gbps == 30.0);
  CHECK(d[2].link_gbps == default_disk_link_gbps);
  CHECK(d[2].latency_us == default_disk_latency_us);
  CHECK_FALSE((d[2].link_gbps_given || d[2].latency_given));
  // Several tiers of one rank are fine (two disks; host then cxl or cxl then host).
  CHECK(parse_tiers("hbm=1GiB,cxl=1GiB,host=1GiB,disk@/a=1GiB,disk@/b=1GiB,redis@h:1=1GiB", 4096).size() == 6);
  CHECK(parse_tiers("hbm=1GiB,redis@localhost:6379=1GiB", 4096)[1].location == "localhost:6379");
  CHECK(parse_tiers("hbm=1GiB,disk@/x=1GiB:lat_us=0", 4096)[1].latency_us == 0.0);
}

TEST_CASE("parse_tiers: every bad storage spec is one clear error naming the problem") {
  CHECK(error_of("hbm=1GiB,disk=1GiB").find("needs its directory: disk@PATH=SIZE") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@=1GiB").find("needs its directory") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis=1GiB").find("needs its server: redis@HOST:PORT") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@localhost=1GiB").find("HOST:PORT") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@:6379=1GiB").find("HOST:PORT") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@h:0=1GiB").find("bad redis port '0'") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@h:70000=1GiB").find("bad redis port") != std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@h:6x79=1GiB").find("bad redis port") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=0").find("gbps must be > 0") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=-2").find("gbps must be > 0") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=fast").find("gbps 'fast' is not a number") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=2x").find("is not a number") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=nan").find("is not a number") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:lat_us=-1").find("lat_us must be >= 0") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:lat_us=inf").find("is not a number") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:gbps=1:gbps=2").find("gbps given twice") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:lat_us=1:lat_us=2").find("lat_us given twice") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:speed=2").find("bad override 'speed=2'") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB:").find("bad override ''") != std::string::npos);
  CHECK(error_of("hbm=1GiB:gbps=2").find("hbm has no link to override") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=0").find("tier 1 (disk): field 'capacity_bytes' must be > 0") != std::string::npos);
  CHECK(error_of("hbm=1GiB,disk@/x=1GB2").find("size") != std::string::npos);
  CHECK(error_of("hbm=1GiB,tape@/x=1GiB").find("unknown tier kind 'tape' (hbm, host, cxl, disk, redis)") !=
        std::string::npos);
  // Fastest first: hbm, host/cxl, disk, redis.
  CHECK(error_of("hbm=1GiB,disk@/x=1GiB,host=1GiB").find("tier 2 (host) comes after a slower disk tier") !=
        std::string::npos);
  CHECK(error_of("hbm=1GiB,redis@h:1=1GiB,disk@/x=1GiB").find("tier 2 (disk) comes after a slower redis tier") !=
        std::string::npos);
  // The struct-level checks a library caller meets too.
  std::vector<tier_config> t = {{.kind = tier_kind::hbm, .capacity_bytes = 8192},
                                {.kind = tier_kind::disk, .capacity_bytes = 8192}};
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (disk): field 'location' (the directory) is required",
                       invalid_argument);
  t[1] = {.kind = tier_kind::host, .capacity_bytes = 8192, .location = "/x"};
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (host): field 'location' is only for disk and redis tiers",
                       invalid_argument);
  t[1] = {.kind = tier_kind::redis, .capacity_bytes = 8192, .numa_node = 1, .location = "h:1"};
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (redis): field 'numa_node' is only for host and cxl tiers",
                       invalid_argument);
  t[1] = {.kind = tier_kind::redis, .capacity_bytes = 8192, .latency_us = -3, .location = "h:1"};
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (redis): field 'latency_us' must be >= 0 and finite",
                       invalid_argument);
  // A redis location built in code gets the check `--tiers` gives (it was taken unchecked and
  // split by each backend's caller).
  t[1] = {.kind = tier_kind::redis, .capacity_bytes = 8192, .location = "localhost"};
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (redis): field 'location': redis needs HOST:PORT, got 'localhost'",
                       invalid_argument);
  t[1].location = "h:70000";
  CHECK_THROWS_WITH_AS(validate_tiers(t, 4096), "hybridcache: tier 1 (redis): field 'location': bad redis port '70000' (1..65535)",
                       invalid_argument);
  const auto ep = parse_redis_endpoint("::1:6380", "x");  // the last colon splits: an IPv6 host keeps its own
  CHECK(ep.host == "::1");
  CHECK(ep.port == 6380);
}

TEST_CASE("timed copy engine: a copy takes bytes over the slower link plus both ends' latency, on the slower tier's "
          "queue") {
  constexpr std::int64_t page = 1 << 20;  // 1 MiB pages
  const std::vector<tier_config> t = parse_tiers(
      "hbm=64MiB,host=64MiB:gbps=50,disk@/d=64MiB:gbps=2:lat_us=100,redis@h:1=64MiB:gbps=1:lat_us=300", page);
  tiered_store<> store(t, page);
  sim::timed_copy_engine engine(t, page, {.links = 1, .per_copy_us = 0.0});
  constexpr std::int64_t bytes = 8 * page;
  const entry_id a{1};
  REQUIRE(store.insert(a, bytes));
  const double mb = static_cast<double>(bytes) / 1e6;  // ms per GB/s
  auto run = [&](tier_id dst) {
    auto tk = store.prepare_move(a, dst);
    REQUIRE(tk.has_value());
    const auto ev = engine.submit(*tk);
    REQUIRE(ev.has_value());
    const auto job = engine.at(*ev);
    REQUIRE(engine.wait(*ev).has_value());
    REQUIRE(store.complete_move(*tk, true).has_value());
    return job;
  };
  // HBM -> disk: the disk's link and latency.
  auto j = run(tier_id{2});
  CHECK(j.start_ms == 0.0);
  CHECK(j.done_ms == doctest::Approx(mb / 2.0 + 0.1));
  CHECK_FALSE(j.onboard);
  // disk -> redis (a cascade): the slower link (1 GB/s) and both latencies; the redis queue
  // is free, so it starts now, not behind the disk copy.
  j = run(tier_id{3});
  CHECK(j.start_ms == 0.0);
  CHECK(j.done_ms == doctest::Approx(mb / 1.0 + 0.1 + 0.3));
  // redis -> HBM (onboard): redis's link and latency, on the onboard queue (free).
  j = run(tier_id{0});
  CHECK(j.onboard);
  CHECK(j.start_ms == 0.0);
  CHECK(j.done_ms == doctest::Approx(mb / 1.0 + 0.3));
  // HBM -> redis again: the redis offload queue is busy until the cascade landed.
  const double redis_free = mb / 1.0 + 0.4;
  j = run(tier_id{3});
  CHECK(j.start_ms == doctest::Approx(redis_free));
  CHECK(j.done_ms == doctest::Approx(redis_free + mb / 1.0 + 0.3));
  // host -> HBM is unaffected by the storage tiers: no latency, 50 GB/s.
  const entry_id b{2};
  REQUIRE(store.insert(b, bytes, tier_id{1}));
  auto tk = store.prepare_move(b, tier_id{0});
  REQUIRE(tk.has_value());
  const auto ev = engine.submit(*tk);
  REQUIRE(ev.has_value());
  CHECK(engine.at(*ev).done_ms == doctest::Approx(mb / 50.0));
  CHECK(engine.onboard_ms(tier_id{3}, 2e6) == doctest::Approx(2.0 + 0.3));
  CHECK(engine.copy_gbps(tier_id{1}, tier_id{2}) == 2.0);
}

namespace {

using test::real_bytes::sessions;

tiered_replay_result replay_over(const std::vector<sim::request>& reqs, const cost_model& m, const char* spec) {
  tiered_replay_options o;
  o.tiers = parse_tiers(spec, 1);
  o.prefill_engines = 1;
  o.recompute_when_faster = false;  // every lower-tier hit is loaded: hits depend on what is held, not on speed
  return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, flop_prefill_time(m));
}

}  // namespace

TEST_CASE("tiered replay: entries cascade hbm -> host -> disk -> redis; with the working set below, hits reach the "
          "infinite-HBM bound") {
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = sessions(12, 8, 7);
  const auto bound = replay_over(reqs, m, "hbm=1TB");  // the same policy, nothing ever evicted
  const auto host = replay_over(reqs, m, "hbm=1GB,host=400MB");
  const auto four = replay_over(
      reqs, m, "hbm=1GB,host=400MB,disk@/unused=800MB:gbps=2:lat_us=100,redis@h:1=64GB:gbps=1:lat_us=300");
  CHECK(host.token_hit_rate() < bound.token_hit_rate());
  CHECK(four.refused == 0);
  CHECK(four.cascades > 0);  // entries went down past host (to disk, then redis)
  CHECK(four.dropped_blocks == 0);
  CHECK(host.token_hit_rate() < bound.token_hit_rate());
  CHECK(four.token_hit_rate() == doctest::Approx(bound.token_hit_rate()));
  // Loads from the slow tiers cost more than the same bytes from host would.
  CHECK(four.bytes_loaded > host.bytes_loaded);
}

TEST_CASE("tiered replay: reload-or-recompute prices a hit at the tier it is read from, not at the host link") {
  // Before: every lower-tier hit was priced at tier 1's link, so a hit on a disk tier at
  // 0.05 GB/s was loaded exactly as often as one at 500 GB/s.
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = sessions(12, 8, 7);
  auto run = [&](const char* spec) {
    tiered_replay_options o;
    o.tiers = parse_tiers(spec, 1);
    o.prefill_engines = 1;
    o.recompute_when_faster = true;
    return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, flop_prefill_time(m));
  };
  const auto fast = run("hbm=1GB,host=400MB,disk@/unused=64GB:gbps=500:lat_us=0");
  const auto slow = run("hbm=1GB,host=400MB,disk@/unused=64GB:gbps=0.05:lat_us=0");
  const auto high_latency = run("hbm=1GB,host=400MB,disk@/unused=64GB:gbps=500:lat_us=2000000");
  MESSAGE("recomputed instead of reloading: fast disk " << fast.recompute_instead_of_reload << ", slow disk "
                                                         << slow.recompute_instead_of_reload << ", 2 s latency "
                                                         << high_latency.recompute_instead_of_reload);
  CHECK(fast.cascades > 0);  // entries do reach the disk tier
  CHECK(slow.recompute_instead_of_reload > fast.recompute_instead_of_reload);
  CHECK(high_latency.recompute_instead_of_reload > fast.recompute_instead_of_reload);
  // What is declined is recomputed: the slow disk's run loads fewer bytes.
  CHECK(slow.bytes_loaded < fast.bytes_loaded);
}

TEST_CASE("tiered replay: the deadline prefetch times a load at the link of the tier it reads from") {
  // Before: the deadline rule estimated every transfer at tier 1's link, so a hit on a slow
  // disk was fetched as late as a host hit of the same size and its request waited for most
  // of it (Σ load time waited on: 1,624 ms against 1,682 ms without any prefetch; 648 ms after).
  const cost_model m(presets::jamba_1_5_mini());
  const auto reqs = sessions(12, 8, 7);
  auto run = [&](const char* spec, prefetch_kind prefetch) {
    tiered_replay_options o;
    o.tiers = parse_tiers(spec, 1);
    o.prefill_engines = 1;
    o.prefetch = prefetch;
    o.arrival_time_scale = 0.15;  // requests queue: what a prefetch is for
    o.marks = {.high = 1.0, .low = 0.9};  // no cleaner: a prefetch may stage into all of HBM's free pages
    return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, flop_prefill_time(m));
  };
  const char* slow_disk = "hbm=1GB,host=400MB,disk@/unused=64GB:gbps=2:lat_us=0";
  const auto on_demand = run(slow_disk, prefetch_kind::none);
  const auto deadline = run(slow_disk, prefetch_kind::deadline);
  MESSAGE("slow disk: load time waited on " << on_demand.load_ms << " ms on demand, " << deadline.load_ms
                                            << " ms with the deadline prefetch (" << deadline.prefetches
                                            << " prefetches); TTFT P50 " << on_demand.ttft_p50_ms << " -> "
                                            << deadline.ttft_p50_ms << " ms");
  CHECK(deadline.cascades > 0);
  CHECK(deadline.prefetches > 0);
  CHECK(deadline.load_ms < 0.6 * on_demand.load_ms);
}
