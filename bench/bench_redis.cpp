// The Redis tier on loopback against redis-benchmark, side by side in one run
// (docs/storage.md has the numbers and the commands). Built only when hiredis was found
// (target hybridcache::redis); needs redis-server and redis-benchmark on PATH (it starts
// its own server on a free port).
//
//   bm_redis_vs_redis_benchmark/<bytes>/<fresh>  goal: the tier's put and get of one value
//                                 (one connection, each operation waited for) reach >= 50 %
//                                 of the throughput redis-benchmark reports for SET and GET
//                                 of values of the same size (-c 1 -P 1: one connection, no
//                                 pipelining), run right before on the same server.
//                                 fresh = 0: both write one key over and over (redis-benchmark's
//                                 default), so the server reuses its memory; fresh = 1: every
//                                 write is a new key (redis-benchmark -r 100000000), so the
//                                 server allocates fresh memory for each value (SET only:
//                                 redis-benchmark's GETs then read random keys it never wrote).
//                                 Counters: tier_put_GBps, rb_set_GBps, put_ratio (throughput),
//                                 put_ratio_p50 (median latency), and the same for get.
//   bm_redis_exists/<keys>        one batched exists (one pipelined round trip)
//   bm_redis_get_small            one get of a 100-byte value: one round trip, for scale
//
//   build/release/bench/bench_redis --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/tiered/redis/redis_backend.hpp>

#include "../tests/support/redis_server.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

test::redis_server& server() {
  static test::redis_server s;
  return s;
}

redis_backend_config config() {
  return {.server = {.endpoints = {{"127.0.0.1", server().port()}}}, .capacity_bytes = std::int64_t{4} << 30,
          .chunk_bytes = std::int64_t{1} << 20, .connections = 1, .queue_depth = 64};
}

std::vector<std::byte> random_bytes(std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(2);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

/// What redis-benchmark reports for one command: requests per second and median latency.
struct rb_result {
  double rps = 0, p50_ms = 0;
};

/// redis-benchmark's SET and GET results for `bytes`-byte values.
std::pair<rb_result, rb_result> redis_benchmark(std::int64_t bytes, int requests, bool fresh) {
  const std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(server().port()) + " -t set,get -d " +
                          std::to_string(bytes) + " -n " + std::to_string(requests) + " -c 1 -P 1 -q --csv" +
                          (fresh ? " -r 100000000" : "") + " 2>/dev/null";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  rb_result set, get;
  if (p == nullptr) return {set, get};
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
    rb_result r;
    double avg = 0, min = 0;
    if (std::sscanf(line, "\"SET\",\"%lf\",\"%lf\",\"%lf\",\"%lf\"", &r.rps, &avg, &min, &r.p50_ms) == 4) set = r;
    if (std::sscanf(line, "\"GET\",\"%lf\",\"%lf\",\"%lf\",\"%lf\"", &r.rps, &avg, &min, &r.p50_ms) == 4) get = r;
  }
  ::pclose(p);
  return {set, get};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

static void bm_redis_vs_redis_benchmark(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  const bool fresh = state.range(1) != 0;
  const int requests = bytes >= (std::int64_t{4} << 20) ? 40 : 400;
  redis_backend<> tier(config());
  const auto v = random_bytes(static_cast<std::size_t>(bytes));
  std::vector<std::byte> into(v.size());
  std::vector<double> put_s, get_s, rb_set_rate, rb_get_rate, rb_set_p50, rb_get_p50;
  for (auto _ : state) {
    (void)server().command("FLUSHALL");
    const auto [set, get] = redis_benchmark(bytes, requests, fresh);
    rb_set_rate.push_back(set.rps);
    rb_get_rate.push_back(get.rps);
    rb_set_p50.push_back(set.p50_ms / 1e3);
    rb_get_p50.push_back(get.p50_ms / 1e3);
    (void)server().command("FLUSHALL");
    for (int i = 0; i < requests; ++i) {
      const storage_key k{1, fresh ? static_cast<std::uint64_t>(i) : 0, fresh ? i : 0, value_kind::kv};
      auto a = std::chrono::steady_clock::now();
      if (tier.wait(*tier.put(k, {0, {}}, v))->status != io_status::ok) state.SkipWithError("put failed");
      auto b = std::chrono::steady_clock::now();
      put_s.push_back(std::chrono::duration<double>(b - a).count());
      a = std::chrono::steady_clock::now();
      if (tier.wait(*tier.get(k, into))->status != io_status::ok) state.SkipWithError("get failed");
      b = std::chrono::steady_clock::now();
      get_s.push_back(std::chrono::duration<double>(b - a).count());
    }
  }
  // Like for like, two ways: throughput (the tier's operations over their total time against
  // redis-benchmark's requests per second) and median latency (the tier's median operation
  // against redis-benchmark's p50), which a slice lost to the shared machine moves less.
  const double gb = static_cast<double>(bytes) / 1e9;
  auto mean_rate = [&](const std::vector<double>& t) {
    double sum = 0;
    for (double x : t) sum += x;
    return gb * static_cast<double>(t.size()) / sum;
  };
  state.counters["tier_put_GBps"] = mean_rate(put_s);
  state.counters["rb_set_GBps"] = gb * median(rb_set_rate);
  state.counters["put_ratio"] = mean_rate(put_s) / (gb * median(rb_set_rate));
  state.counters["put_ratio_p50"] = median(rb_set_p50) / median(put_s);
  state.counters["tier_get_GBps"] = mean_rate(get_s);
  if (!fresh) {  // with -r, redis-benchmark GETs random keys it mostly never wrote (nil replies)
    state.counters["rb_get_GBps"] = gb * median(rb_get_rate);
    state.counters["get_ratio"] = mean_rate(get_s) / (gb * median(rb_get_rate));
    state.counters["get_ratio_p50"] = median(rb_get_p50) / median(get_s);
  }
}
BENCHMARK(bm_redis_vs_redis_benchmark)
    ->ArgsProduct({{64 << 10, 1 << 20, 9'200'000}, {0, 1}})
    ->ArgNames({"bytes", "fresh"})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

static void bm_redis_exists(benchmark::State& state) {
  redis_backend<> tier(config());
  (void)server().command("FLUSHALL");
  std::vector<storage_key> keys;
  for (std::int64_t i = 0; i < state.range(0); ++i) keys.push_back({3, static_cast<std::uint64_t>(i), i, value_kind::kv});
  const auto v = random_bytes(100);
  for (std::size_t i = 0; i < keys.size(); i += 2) (void)tier.wait(*tier.put(keys[i], {0, {}}, v));
  std::vector<std::uint8_t> found(keys.size());
  const std::int64_t before = tier.counters().round_trips;
  for (auto _ : state) benchmark::DoNotOptimize(tier.wait(*tier.exists(keys, found)));
  state.counters["round_trips_per_call"] =
      static_cast<double>(tier.counters().round_trips - before) / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_redis_exists)->Arg(1)->Arg(1000)->UseRealTime()->Unit(benchmark::kMicrosecond);

static void bm_redis_get_small(benchmark::State& state) {
  redis_backend<> tier(config());
  const storage_key k{4, 4, 4, value_kind::kv};
  const auto v = random_bytes(100);
  (void)tier.wait(*tier.put(k, {0, {}}, v));
  std::vector<std::byte> into(100);
  for (auto _ : state)
    if (tier.wait(*tier.get(k, into))->status != io_status::ok) state.SkipWithError("get failed");
}
BENCHMARK(bm_redis_get_small)->UseRealTime()->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  if (!test::redis_tools_available() || std::system("command -v redis-benchmark >/dev/null 2>&1") != 0) {
    std::printf("bench_redis: redis-server / redis-cli / redis-benchmark not found; nothing measured\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
