// The Redis tier against a real redis-server started by the test (ctest backends.redis): the
// storage_backend conformance suite, then faults — the server killed mid-run and brought
// back, values corrupted, truncated or swapped inside Redis, a server that is not there at
// start-up, a wrong password — and the properties the issue fixes: exists over 1,000 keys
// in one round trip, values written with another chunk size, and capacity counted by the
// writer (the server's maxmemory never has to evict). Last, the runtime's users of the tier:
// host_copy_engine with a Redis tier and shared_prefix_store across two connections.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hybridcache/tiered/redis/redis_backend.hpp"
#include "hybridcache/tiered/redis/redis_probe.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/sim/tiered_replay_real_bytes.hpp"
#include "hybridcache/tiered/disk_backend.hpp"
#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/shared_prefix_store.hpp"
#include "hybridcache/tiered/tiered_store.hpp"
#include "../conformance/storage_backend_laws.hpp"
#include "../support/redis_server.hpp"
#include "../support/storage_ops.hpp"
#include "../support/temp_dir.hpp"
#include "../support/tiny_hybrid_model.hpp"
#include "../tiered/real_bytes_support.hpp"
#include "raw_redis_client.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;
using namespace hybridcache::sim;

namespace {

using test::storage_ops::get;
using test::storage_ops::put;

constexpr std::int64_t mib = std::int64_t{1} << 20;

redis_backend_config config_for(int port, std::int64_t capacity, std::int32_t depth = 64) {
  return {.server = {.endpoints = {{"127.0.0.1", port}},
                     .connect_timeout = std::chrono::milliseconds(300),
                     .io_timeout = std::chrono::milliseconds(2000),
                     .retry_after = std::chrono::milliseconds(50)},
          .capacity_bytes = capacity,
          .chunk_bytes = 256 * 1024,
          .connections = 2,
          .queue_depth = depth};
}

/// One server for the conformance fixtures of this process, emptied for each fixture.
test::redis_server& shared_server() {
  static test::redis_server server;
  return server;
}

/// Flips one payload byte of a value inside Redis (GETRANGE, then SET the chunk back).
template <class B>
bool corrupt_in_redis(B& b, int port, const storage_key& k) {
  test::raw_redis_client c(port);
  const std::string key = b.chunk_key_of(k, 1);
  auto chunk = c.get(key);
  std::string used = key;
  if (!chunk) {  // no payload: damage the header instead
    used = b.chunk_key_of(k, 0);
    chunk = c.get(used);
    if (!chunk) return false;
  }
  (*chunk)[chunk->size() - 1] = static_cast<char>((*chunk)[chunk->size() - 1] ^ 0x20);
  c.set(used, *chunk);
  return true;
}

struct redis_fixture {
  using backend_type = redis_backend<>;
  static constexpr const char* name = "redis";
  redis_fixture(std::int64_t capacity, std::int32_t depth) : b(config_for(shared_server().port(), capacity, depth)) {
    REQUIRE(shared_server().command("FLUSHALL").rfind("+OK", 0) == 0);
  }
  backend_type& backend() { return b; }
  bool corrupt(const storage_key& k) { return corrupt_in_redis(b, shared_server().port(), k); }
  backend_type b;
};

std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& x : v) x = static_cast<std::byte>(rng());
  return v;
}
storage_key key_n(std::uint64_t i) { return {77, 5000 + i, static_cast<std::int64_t>(i + 1), value_kind::kv}; }

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(storage_backend_conformance, redis_fixture);

TEST_CASE("redis tier: the server killed mid-run turns into misses, never garbage, and comes back") {
  test::redis_server server;
  redis_backend<> b(config_for(server.port(), 256 * mib));
  std::atomic<int> wrong{0}, ok_gets{0}, unavailable{0}, ops{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t)
    clients.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 9);
      std::vector<std::byte> into(600000);
      while (!stop.load()) {
        const std::uint64_t i = rng() % 16;
        const auto v = pattern(i, 300000 + i * 1000);  // two chunks and more: SIGPIPE territory
        if (rng() % 2 == 0) {
          if (auto tk = b.put(key_n(i), {0, {}}, v)) {
            const auto r = b.wait(*tk);
            if (r->status == io_status::unavailable) ++unavailable;
            else if (r->status != io_status::ok) ++wrong;
          }
        } else if (auto tk = b.get(key_n(i), into)) {
          const auto r = b.wait(*tk);
          if (r->status == io_status::ok) {
            ++ok_gets;
            if (r->bytes != static_cast<std::int64_t>(v.size()) || !std::equal(v.begin(), v.end(), into.begin())) ++wrong;
          } else if (r->status == io_status::unavailable) {
            ++unavailable;
          } else if (r->status != io_status::not_found) {
            ++wrong;
          }
        }
        ++ops;
      }
    });
  auto wait_ops = [&](int n) {
    const int target = ops.load() + n;
    while (ops.load() < target) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  wait_ops(100);
  server.kill();  // SIGKILL: connections reset, everything stored is gone
  wait_ops(100);
  CHECK(unavailable.load() > 0);
  server.start();  // same port, empty
  wait_ops(200);
  stop = true;
  for (auto& c : clients) c.join();
  CHECK(wrong.load() == 0);
  CHECK(ok_gets.load() > 0);
  const backend_counters c = b.counters();
  CHECK(c.unavailable > 0);
  CHECK(c.reconnects >= 1);
  CHECK(c.corrupt == 0);
  // After the restart the tier works normally again.
  const auto v = pattern(99, 700000);
  REQUIRE(put(b, key_n(99), v).status == io_status::ok);
  std::vector<std::byte> into(v.size());
  REQUIRE(get(b, key_n(99), into).status == io_status::ok);
  CHECK(into == v);
  MESSAGE("server killed mid-run: " << c.unavailable << " operations unavailable, " << c.reconnects
                                    << " reconnects, " << ok_gets.load() << " verified hits, 0 wrong");
}

TEST_CASE("redis tier: corrupt, truncated and swapped values inside Redis are counted misses") {
  test::redis_server server;
  redis_backend<> b(config_for(server.port(), 64 * mib));
  test::raw_redis_client raw(server.port());
  const auto v = pattern(1, 700000);  // the header, then three payload chunks of <= 256 KiB
  std::vector<std::byte> into(v.size());
  auto stored = [&](std::uint64_t i) { REQUIRE(put(b, key_n(i), v).status == io_status::ok); };

  stored(1);  // a middle chunk deleted (maxmemory, a half-finished write): incomplete
  REQUIRE(raw.integer("DEL " + b.chunk_key_of(key_n(1), 1)) == 1);
  CHECK(get(b, key_n(1), into).status == io_status::corrupt);
  CHECK(raw.integer("EXISTS " + b.chunk_key_of(key_n(1), 0)) == 0);  // deleted as corrupt

  stored(2);  // the last chunk truncated
  raw.set(b.chunk_key_of(key_n(2), 3), "short");
  CHECK(get(b, key_n(2), into).status == io_status::corrupt);

  stored(3);  // one byte flipped inside a chunk: only the CRC can see it
  REQUIRE(corrupt_in_redis(b, server.port(), key_n(3)));
  CHECK(get(b, key_n(3), into).status == io_status::corrupt);

  stored(4);  // a damaged header
  auto head = *raw.get(b.chunk_key_of(key_n(4), 0));
  head[30] = static_cast<char>(head[30] ^ 1);
  raw.set(b.chunk_key_of(key_n(4), 0), head);
  CHECK(get(b, key_n(4), into).status == io_status::corrupt);

  stored(5);  // another key's value copied under this key's name: the header says whose
  stored(6);
  for (int i = 0; i < 4; ++i) raw.set(b.chunk_key_of(key_n(5), i), *raw.get(b.chunk_key_of(key_n(6), i)));
  CHECK(get(b, key_n(5), into).status == io_status::corrupt);

  stored(7);  // chunk 0 is not even a header
  raw.set(b.chunk_key_of(key_n(7), 0), "hello");
  CHECK(get(b, key_n(7), into).status == io_status::corrupt);

  CHECK(b.counters().corrupt == 6);
  CHECK(b.counters().hits == 0);
  REQUIRE(get(b, key_n(6), into).status == io_status::ok);  // the untouched one
  CHECK(into == v);
}

TEST_CASE("redis tier: exists over 1,000 keys is one round trip") {
  test::redis_server server;
  redis_backend<> b(config_for(server.port(), 64 * mib));
  std::vector<storage_key> keys;
  for (std::uint64_t i = 0; i < 1000; ++i) keys.push_back(key_n(i));
  for (std::uint64_t i = 0; i < 1000; i += 3) REQUIRE(put(b, keys[i], pattern(i, 100)).status == io_status::ok);
  const std::int64_t before = b.counters().round_trips;
  std::vector<std::uint8_t> found(keys.size());
  const auto t = b.exists(keys, found);
  REQUIRE(t);
  const io_result r = b.wait(*t).value();
  CHECK(r.status == io_status::ok);
  CHECK(r.bytes == 334);
  CHECK(b.counters().round_trips - before == 1);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(found[i] == (i % 3 == 0 ? 1 : 0));
  // A put is one round trip too (chunks and evictions in one pipeline), a get as well.
  const std::int64_t p0 = b.counters().round_trips;
  REQUIRE(put(b, key_n(5000), pattern(5, 3 * mib)).status == io_status::ok);
  std::vector<std::byte> into(3 * mib);
  REQUIRE(get(b, key_n(5000), into).status == io_status::ok);
  CHECK(b.counters().round_trips - p0 == 2);
}

TEST_CASE("redis tier: a value written with another chunk size is read by every node") {
  test::redis_server server;
  auto small_chunks = config_for(server.port(), 64 * mib);
  small_chunks.chunk_bytes = 4096;
  redis_backend<> writer(small_chunks);
  redis_backend<> reader(config_for(server.port(), 64 * mib));
  const auto v = pattern(3, 100000);
  REQUIRE(put(writer, key_n(1), v).status == io_status::ok);
  std::vector<std::byte> into(v.size());
  const io_result r = get(reader, key_n(1), into);
  REQUIRE(r.status == io_status::ok);
  CHECK(into == v);
  test::raw_redis_client raw(server.port());
  CHECK(raw.integer("DBSIZE") == chunk_count(100000, 4096));
  const auto t = reader.remove(key_n(1));  // and removed whole by a node that did not write it
  REQUIRE(t);
  CHECK(reader.wait(*t)->status == io_status::ok);
  CHECK(raw.integer("DBSIZE") == 0);
}

TEST_CASE("redis tier: the writer counts its bytes, so maxmemory never evicts a chunk") {
  test::redis_server server({.cluster = false, .maxmemory = "8mb", .extra = {}});
  const std::int64_t capacity = 4 * mib;
  redis_backend<> b(config_for(server.port(), capacity));
  for (std::uint64_t i = 0; i < 40; ++i) {  // 20 MB written through a 4 MiB budget
    REQUIRE(put(b, key_n(i), pattern(i, 500000)).status == io_status::ok);
    CHECK(b.used_bytes() <= capacity);
  }
  test::raw_redis_client raw(server.port());
  const std::string stats = raw.text("INFO stats");
  CHECK(stats.find("evicted_keys:0\r\n") != std::string::npos);
  CHECK(b.counters().evictions == 40 - b.entries());
  std::vector<std::byte> into(500000);
  CHECK(get(b, key_n(39), into).status == io_status::ok);  // most recent: held
  CHECK(get(b, key_n(0), into).status == io_status::not_found);  // evicted by the scorer
  CHECK(raw.integer("DBSIZE") == b.entries() * chunk_count(500000, 256 * 1024));
}

TEST_CASE("redis tier: no server at start-up, a wrong password: unavailable, counted, no exception") {
  const int port = test::free_loopback_port();
  redis_backend<> b(config_for(port, 16 * mib));
  std::vector<std::byte> into(1000);
  for (int i = 0; i < 20; ++i) CHECK(get(b, key_n(1), into).status == io_status::unavailable);
  CHECK(put(b, key_n(1), pattern(1, 1000)).status == io_status::unavailable);
  std::vector<storage_key> keys{key_n(1), key_n(2)};
  std::vector<std::uint8_t> found(2, 9);
  CHECK(b.wait(*b.exists(keys, found))->status == io_status::unavailable);
  CHECK(found == std::vector<std::uint8_t>{0, 0});
  CHECK(b.counters().unavailable == 22);
  CHECK(b.used_bytes() == 0);

  test::redis_server locked({.cluster = false, .maxmemory = {}, .extra = {"--requirepass", "s3cret"}});
  auto good = config_for(locked.port(), 16 * mib);
  good.server.password = "s3cret";
  auto bad = good;
  bad.server.password = "wrong";
  redis_backend<> with(good), without(bad);
  const auto v = pattern(2, 5000);
  CHECK(put(with, key_n(2), v).status == io_status::ok);
  CHECK(get(without, key_n(2), into).status == io_status::unavailable);
  std::vector<std::byte> back(v.size());
  CHECK(get(with, key_n(2), back).status == io_status::ok);
  CHECK(back == v);
}

TEST_CASE("redis tier: bad configuration names the field") {
  auto bad = [](auto edit, const char* field) {
    redis_backend_config c = config_for(6379, mib);
    edit(c);
    CHECK_THROWS_WITH_AS(redis_backend<>{c}, doctest::Contains(field), invalid_argument);
  };
  bad([](redis_backend_config& c) { c.server.endpoints.clear(); }, "endpoints");
  bad([](redis_backend_config& c) { c.server.endpoints[0].port = 70000; }, "endpoints");
  bad([](redis_backend_config& c) { c.capacity_bytes = 0; }, "capacity_bytes");
  bad([](redis_backend_config& c) { c.chunk_bytes = 100; }, "chunk_bytes");
  bad([](redis_backend_config& c) { c.connections = 0; }, "connections");
  bad([](redis_backend_config& c) { c.queue_depth = 0; }, "queue_depth");
  bad([](redis_backend_config& c) { c.server.io_timeout = std::chrono::milliseconds(0); }, "io_timeout");
  bad([](redis_backend_config& c) { c.key_prefix = "a{b}"; }, "key_prefix");
  bad([](redis_backend_config& c) {
    c.server.cluster = true;
    c.server.database = 2;
  }, "database");
}

// The Redis probe of the tier spec (tiered/redis/redis_probe.hpp): what `hcbench replay
// --tiers ...,redis@HOST:PORT=SIZE` measures at start-up when the spec gives no :gbps= /
// :lat_us=. An unreachable server is an error, never a default.
TEST_CASE("redis tier: the start-up probe measures round trip and GB/s, cleans up, and fails on a dead server") {
  test::redis_server server;
  const std::string ep = "127.0.0.1:" + std::to_string(server.port());
  const auto r = probe_redis(ep, {.pings = 5, .rounds = 2, .value_bytes = 1 << 20});
  CHECK(r.round_trip_us > 0.0);
  CHECK(r.set_gbps > 0.0);
  CHECK(r.get_gbps > 0.0);
  CHECK(r.value_bytes == 1 << 20);
  test::raw_redis_client raw(server.port());
  CHECK(raw.integer("DBSIZE") == 0);  // the probe key is deleted
  CHECK_THROWS_AS((void)probe_redis("127.0.0.1", {}), invalid_argument);
  CHECK_THROWS_AS((void)probe_redis(ep, {.pings = 0}), invalid_argument);
  server.stop();
  const std::string expected = "redis probe of " + ep + ": cannot connect";
  CHECK_THROWS_WITH_AS((void)probe_redis(ep, {.timeout = std::chrono::milliseconds(300)}),
                       doctest::Contains(expected.c_str()), error);
}

// The timed replay's real-bytes mode over hbm, host, disk and a Redis tier
// (sim/tiered_replay_real_bytes.hpp; the disk-only case is tests/tiered/test_real_bytes.cpp):
// the real run's hits and loaded bytes are the modelled run's, and entries reach Redis.
TEST_CASE("redis tier: a real-bytes replay over hbm, host, disk and redis has the modelled run's hits") {
  test::redis_server server;
  const cost_model m(test::tiny_hybrid_spec());
  const auto reqs = test::real_bytes::sessions(12, 8, 7);
  const test::temp_dir dir("hc_real_bytes_redis");
  const auto o = test::real_bytes::options("hbm=1MB,host=300KB,disk@" + dir.str() + "=300KB:gbps=2:lat_us=100,redis@127.0.0.1:" +
                                           std::to_string(server.port()) + "=64MB:gbps=1:lat_us=200");
  const auto modelled = run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{},
                                                                        flop_prefill_time(m));
  REQUIRE(modelled.cascades > 0);
  disk_backend<> disk({.directory = dir.str() + "/values", .capacity_bytes = std::int64_t{64} << 20});
  redis_backend<> redis(config_for(server.port(), std::int64_t{256} << 20));
  const auto real = run_tiered_replay_real_bytes<prefix::judicious_admission>(
      reqs, m, o, {tiered::storage_io_of(disk), tiered::storage_io_of(redis)}, prefix::lru_scorer{}, flop_prefill_time(m));
  CHECK(real.hbm_hit_tokens == modelled.hbm_hit_tokens);
  CHECK(real.host_hit_tokens == modelled.host_hit_tokens);
  CHECK(real.bytes_loaded == modelled.bytes_loaded);
  CHECK(real.real.failed_copies == 0);
  CHECK(real.copy_failures == 0);
  CHECK(real.real.verified_copies > 0);
  CHECK(redis.counters().puts > 0);  // entries cascaded down to Redis
  CHECK(redis.counters().hits > 0);  // and were read back from it
}

TEST_CASE("redis tier: under host_copy_engine an entry goes hbm -> host -> redis -> hbm with its bytes; "
          "a value gone from Redis fails the copy and keeps the source") {
  // The runtime's engine with a Redis tier (tiered/host_copy_engine.hpp): no arena for it, its
  // pages are values on the server. Two engines share the server (their keys are salted apart).
  test::redis_server server;
  redis_backend<> b(config_for(server.port(), 64 * mib));
  constexpr std::int64_t page = 4096;
  const std::vector<tier_config> tiers{{.kind = tier_kind::hbm, .capacity_bytes = 16 * page},
                                       {.kind = tier_kind::host, .capacity_bytes = 16 * page},
                                       {.kind = tier_kind::redis, .capacity_bytes = 64 * page,
                                        .location = "127.0.0.1:" + std::to_string(server.port())}};
  const tier_id host{1}, redis{2};
  tiered_store<> s1(tiers, page), s2(tiers, page);
  host_copy_engine e1(tiers, page, {.measure_bandwidth = false}, {storage_io_of(b)});
  host_copy_engine e2(tiers, page, {.measure_bandwidth = false}, {storage_io_of(b)});
  CHECK(e1.arena_bytes(redis) == 0);
  const auto fill = [&](tiered_store<>& s, host_copy_engine& e, entry_id id, std::uint8_t seed) {
    const auto row = s.find(id);
    const tier_copy& c = row->copies.front();
    for (std::int64_t i = 0; i < c.bytes; ++i)
      e.base(c.tier)[static_cast<std::int64_t>(c.pages.page(i / page)) * page + i % page] =
          static_cast<std::byte>((seed * 31 + i * 7) & 0xff);
  };
  const auto holds = [&](tiered_store<>& s, host_copy_engine& e, entry_id id, std::uint8_t seed) {
    const auto row = s.find(id);
    const tier_copy* c = row->home();
    for (std::int64_t i = 0; i < c->bytes; ++i)
      if (e.base(c->tier)[static_cast<std::int64_t>(c->pages.page(i / page)) * page + i % page] !=
          static_cast<std::byte>((seed * 31 + i * 7) & 0xff))
        return false;
    return true;
  };
  REQUIRE(s1.insert(entry_id{1}, 5 * page - 100).has_value());
  REQUIRE(s2.insert(entry_id{1}, 5 * page - 100).has_value());
  fill(s1, e1, entry_id{1}, 1);
  fill(s2, e2, entry_id{1}, 2);
  REQUIRE(move_entry(s1, e1, entry_id{1}, host).has_value());
  REQUIRE(move_entry(s1, e1, entry_id{1}, redis).has_value());
  REQUIRE(move_entry(s2, e2, entry_id{1}, redis).has_value());
  CHECK(b.counters().puts == 2);
  REQUIRE(move_entry(s1, e1, entry_id{1}, hbm_tier).has_value());
  CHECK(holds(s1, e1, entry_id{1}, 1));
  // Entry 1 of the second engine: its value deleted inside Redis (FLUSHALL) -> a miss.
  test::raw_redis_client raw(server.port());
  (void)raw.args({"FLUSHALL"});
  const auto r = move_entry(s2, e2, entry_id{1}, hbm_tier);
  CHECK_FALSE(r.has_value());
  CHECK(s2.find(entry_id{1})->tier() == redis);
  CHECK(e2.storage_pages(redis)->counters().get_failures == 1);
}

TEST_CASE("redis tier: shared_prefix_store: what one store publishes another finds on the same server") {
  test::redis_server server;
  redis_backend<> writer_backend(config_for(server.port(), 64 * mib)), reader_backend(config_for(server.port(), 64 * mib));
  const shared_prefix_config c{.model = 9, .kv_bytes_per_token = 256, .state_bytes = 4096, .kv_layers = 2, .state_layers = 2};
  std::vector<token_id> prompt(300);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<token_id>(i * 7 % 1000);
  const auto kv_byte = [](std::size_t i) { return static_cast<std::byte>((i * 13 + 5) & 0xff); };
  {
    shared_prefix_store<redis_backend<>> w(writer_backend, c);
    for (const std::int64_t b : {100, 200})
      CHECK(w.publish(prompt, cache_salt{3}, b,
                      [&](std::span<std::byte> o) { for (std::size_t i = 0; i < o.size(); ++i) o[i] = kv_byte(i); },
                      [&](std::span<std::byte> o) { std::fill(o.begin(), o.end(), static_cast<std::byte>(b)); }));
  }
  shared_prefix_store<redis_backend<>> r(reader_backend, c);
  std::vector<std::byte> kv, state;
  const std::vector<std::int64_t> at{100, 200, 299};
  REQUIRE(r.find(prompt, cache_salt{3}, at, 0, kv, state) == 200);
  REQUIRE(kv.size() == 200u * 256u);
  for (std::size_t i = 0; i < kv.size(); ++i) REQUIRE(kv[i] == kv_byte(i));
  CHECK(std::all_of(state.begin(), state.end(), [](std::byte x) { return x == static_cast<std::byte>(200); }));
  CHECK(r.find(prompt, cache_salt{4}, at, 0, kv, state) == 0);  // another tenant
  CHECK(reader_backend.counters().round_trips > 0);
}
