// The Redis tier over a three-node Redis Cluster started by the test (`redis-cli --cluster
// create`, ctest backends.redis_cluster): the conformance suite, the slot function against
// the servers' own CLUSTER KEYSLOT, values spread over every shard with each value's chunks
// on one, exists over 1,000 keys on three shards in one round, a slot migrated under a live
// tier (ASK while it moves, MOVED after), and one node killed (its values unavailable, the
// others still served).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/tiered/redis/redis_backend.hpp"
#include "../conformance/storage_backend_laws.hpp"
#include "../support/redis_server.hpp"
#include "../support/storage_ops.hpp"
#include "raw_redis_client.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

using test::storage_ops::get;
using test::storage_ops::put;

constexpr std::int64_t mib = std::int64_t{1} << 20;

redis_backend_config cluster_config(test::redis_cluster& c, std::int64_t capacity, std::int32_t depth = 64) {
  return {.server = {.endpoints = {{"127.0.0.1", c.node(1).port()}},  // one seed: the rest from CLUSTER SLOTS
                     .cluster = true,
                     .connect_timeout = std::chrono::milliseconds(300),
                     .io_timeout = std::chrono::milliseconds(2000),
                     .retry_after = std::chrono::milliseconds(50)},
          .capacity_bytes = capacity,
          .chunk_bytes = 128 * 1024,
          .connections = 2,
          .queue_depth = depth};
}

test::redis_cluster& shared_cluster() {
  static test::redis_cluster cluster;
  return cluster;
}

/// The node holding `key` (its GET answers a value; the others answer MOVED).
int owner_port(test::redis_cluster& c, const std::string& key) {
  for (std::size_t i = 0; i < c.size(); ++i) {
    test::raw_redis_client raw(c.node(i).port());
    if (raw.get(key)) return c.node(i).port();
  }
  return -1;
}

struct redis_cluster_fixture {
  using backend_type = redis_backend<>;
  static constexpr const char* name = "redis cluster";
  redis_cluster_fixture(std::int64_t capacity, std::int32_t depth) : b(cluster_config(shared_cluster(), capacity, depth)) {
    for (std::size_t i = 0; i < shared_cluster().size(); ++i) REQUIRE(shared_cluster().node(i).command("FLUSHALL").rfind("+OK", 0) == 0);
  }
  backend_type& backend() { return b; }
  bool corrupt(const storage_key& k) {
    for (const std::int64_t chunk : {std::int64_t{1}, std::int64_t{0}}) {
      const std::string key = b.chunk_key_of(k, chunk);
      const int port = owner_port(shared_cluster(), key);
      if (port < 0) continue;
      test::raw_redis_client raw(port);
      std::string v = *raw.get(key);
      if (v.empty()) continue;
      v.back() = static_cast<char>(v.back() ^ 0x20);
      raw.set(key, v);
      return true;
    }
    return false;
  }
  backend_type b;
};

std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& x : v) x = static_cast<std::byte>(rng());
  return v;
}
storage_key key_n(std::uint64_t i) { return {91, 7000 + i, static_cast<std::int64_t>(i + 1), value_kind::checkpoint}; }
value_meta meta_of(const storage_key& k) { return {k.tokens, {layer_order::layer_major, 28}}; }

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(storage_backend_conformance, redis_cluster_fixture);

TEST_CASE("redis cluster: our slot function is the servers', and every shard holds whole values") {
  auto& c = shared_cluster();
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).command("FLUSHALL").rfind("+OK", 0) == 0);
  redis_backend<> b(cluster_config(c, 256 * mib));
  test::raw_redis_client raw(c.node(0).port());
  std::mt19937_64 rng(8);
  for (int i = 0; i < 200; ++i) {
    const std::string key = b.chunk_key_of(key_n(rng()), static_cast<std::int64_t>(rng() % 40));
    CHECK(raw.integer("CLUSTER KEYSLOT " + key) == cluster_slot(key));
  }
  for (const char* key : {"foo", "bar", "{user1000}.following", "a{b}c", "x{}y"})
    CHECK(raw.integer(std::string("CLUSTER KEYSLOT ") + key) == cluster_slot(key));

  std::vector<std::vector<std::byte>> values;
  for (std::uint64_t i = 0; i < 60; ++i) {
    values.push_back(pattern(i, 300000));  // a header and three payload chunks each
    REQUIRE(put(b, key_n(i), meta_of(key_n(i)), values.back()).status == io_status::ok);
  }
  long long total = 0;
  for (std::size_t n = 0; n < c.size(); ++n) {
    test::raw_redis_client node(c.node(n).port());
    const long long keys = node.integer("DBSIZE");
    CHECK(keys > 0);   // every shard got some values ...
    CHECK(keys % 4 == 0);  // ... and only whole ones (4 keys each)
    total += keys;
  }
  CHECK(total == 240);
  std::vector<std::byte> into(300000);
  for (std::uint64_t i = 0; i < 60; ++i) {
    const io_result r = get(b, key_n(i), into);
    REQUIRE(r.status == io_status::ok);
    CHECK(r.meta == meta_of(key_n(i)));
    CHECK(into == values[i]);
  }
  // exists over 1,000 keys on three shards: one round (all shards at once).
  std::vector<storage_key> keys;
  for (std::uint64_t i = 0; i < 1000; ++i) keys.push_back(key_n(i));
  std::vector<std::uint8_t> found(keys.size());
  const std::int64_t before = b.counters().round_trips;
  const io_result r = b.wait(*b.exists(keys, found)).value();
  CHECK(r.status == io_status::ok);
  CHECK(r.bytes == 60);
  CHECK(b.counters().round_trips - before == 1);
  CHECK(std::count(found.begin(), found.begin() + 60, std::uint8_t{1}) == 60);
  CHECK(b.counters().redirects == 0);
}

TEST_CASE("redis cluster: a slot migrated under a live tier (ASK while it moves, MOVED after)") {
  auto& c = shared_cluster();
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).command("FLUSHALL").rfind("+OK", 0) == 0);
  redis_backend<> b(cluster_config(c, 256 * mib));
  const auto v = pattern(5, 300000);
  const storage_key k = key_n(4242);
  REQUIRE(put(b, k, meta_of(k), v).status == io_status::ok);  // the tier has its slot map now
  const std::uint16_t slot = cluster_slot(name_of(k));
  const int src_port = owner_port(c, b.chunk_key_of(k, 0));
  REQUIRE(src_port > 0);
  int dst_port = -1;
  for (std::size_t i = 0; i < c.size(); ++i)
    if (c.node(i).port() != src_port) dst_port = c.node(i).port();
  test::raw_redis_client src(src_port), dst(dst_port);
  const std::string src_id = src.text("CLUSTER MYID"), dst_id = dst.text("CLUSTER MYID");
  const std::string s = std::to_string(slot);
  REQUIRE(dst.args({"CLUSTER", "SETSLOT", s, "IMPORTING", src_id}) == "OK");
  REQUIRE(src.args({"CLUSTER", "SETSLOT", s, "MIGRATING", dst_id}) == "OK");
  std::vector<std::string> migrate{"MIGRATE", "127.0.0.1", std::to_string(dst_port), "", "0", "5000", "KEYS"};
  for (int i = 0; i < 4; ++i) migrate.push_back(b.chunk_key_of(k, i));
  REQUIRE(src.args(migrate) == "OK");
  // Mid-migration: the source answers ASK for the keys it no longer has.
  std::vector<std::byte> into(v.size());
  io_result r = get(b, k, into);
  REQUIRE(r.status == io_status::ok);
  CHECK(into == v);
  const std::int64_t asked = b.counters().redirects;
  CHECK(asked >= 4);  // the header and three payload chunks
  // Done: every node learns the new owner; the tier's map is stale and follows MOVED.
  for (std::size_t i = 0; i < c.size(); ++i) {
    test::raw_redis_client n(c.node(i).port());
    REQUIRE(n.args({"CLUSTER", "SETSLOT", s, "NODE", dst_id}) == "OK");
  }
  std::fill(into.begin(), into.end(), std::byte{0});
  r = get(b, k, into);
  REQUIRE(r.status == io_status::ok);
  CHECK(into == v);
  CHECK(b.counters().redirects > asked);
  // With the map refreshed, the next operations go straight to the new owner.
  const std::int64_t settled = b.counters().redirects;
  REQUIRE(put(b, k, meta_of(k), pattern(6, 300000)).status == io_status::ok);
  REQUIRE(get(b, k, into).status == io_status::ok);
  CHECK(into == pattern(6, 300000));
  CHECK(b.counters().redirects == settled);
  CHECK(owner_port(c, b.chunk_key_of(k, 0)) == dst_port);
}

TEST_CASE("redis cluster: one node killed: its values are unavailable, the others still served") {
  test::redis_cluster c;  // its own cluster: this one loses a node
  redis_backend<> b(cluster_config(c, 256 * mib));
  std::vector<std::vector<std::byte>> values;
  for (std::uint64_t i = 0; i < 30; ++i) {
    values.push_back(pattern(i + 100, 200000));
    REQUIRE(put(b, key_n(i), meta_of(key_n(i)), values.back()).status == io_status::ok);
  }
  c.node(2).kill();
  int ok = 0, unavailable = 0;
  std::vector<std::byte> into(200000);
  for (std::uint64_t i = 0; i < 30; ++i) {
    const io_result r = get(b, key_n(i), into);
    if (r.status == io_status::ok) {
      CHECK(into == values[i]);
      ++ok;
    } else {
      CHECK(r.status == io_status::unavailable);
      ++unavailable;
    }
  }
  CHECK(ok > 0);
  CHECK(unavailable > 0);
  CHECK(b.counters().corrupt == 0);
  MESSAGE("node 3 of 3 killed: " << ok << " values still served, " << unavailable << " unavailable");
}
