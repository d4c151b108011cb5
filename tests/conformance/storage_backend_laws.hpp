// Conformance suite of `hybridcache::storage_backend` (concepts/storage_backend.hpp),
// one typed test case over every model. tests/conformance/test_storage_backend.cpp
// instantiates it for the reference model and the disk tier; the Redis tier needs a server
// and hiredis, so tests/backends/test_redis_backend.cpp instantiates it there.
//
// A fixture F provides:
//   using backend_type = ...;
//   static constexpr const char* name;
//   explicit F(std::int64_t capacity_bytes, std::int32_t queue_depth);  // a fresh, empty tier
//   backend_type& backend();
//   bool corrupt(const storage_key&);   // flips a stored payload byte where the tier keeps it
//
// Laws (each a SUBCASE below):
//   - what was put is got back byte for byte with its meta, for sizes from 0 to many blocks;
//   - a key differing in any one field (model, prefix, tokens, kind) is another value;
//   - a put replaces; remove removes; an absent key is `not_found`, counted as a miss;
//   - exists answers per key, for a batch;
//   - a buffer smaller than the value is `too_large` and is not written;
//   - a corrupted value is `corrupt` (a miss, counted) and is gone afterwards;
//   - tickets: consumed once, stale or forged ones are `stale_handle`; a full queue is busy;
//   - bad input is `invalid_argument` with counters and bytes unchanged;
//   - on random operation sequences (capacity small enough to evict) every status, every
//     exists answer and the bytes held equal the reference model's (LRU).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/concepts/storage_backend.hpp"
#include "hybridcache/tiered/storage_format.hpp"
#include "../support/memory_storage_backend.hpp"
#include "../support/storage_ops.hpp"

namespace hybridcache::test::storage_laws {
using namespace hybridcache::test::storage_ops;
}  // namespace hybridcache::test::storage_laws

TEST_CASE_TEMPLATE_DEFINE("storage_backend conformance", F, storage_backend_conformance) {
  using namespace hybridcache;
  using namespace hybridcache::tiered;
  using namespace hybridcache::test::storage_laws;
  static_assert(storage_backend<typename F::backend_type>);
  constexpr std::int64_t mib = std::int64_t{1} << 20;

  SUBCASE("put then get returns the bytes and the meta, for sizes from 0 to several blocks") {
    F f(64 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(11);
    std::vector<std::pair<storage_key, std::vector<std::byte>>> held;
    std::vector<value_meta> metas;
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{4096}, std::size_t{65537},
                                std::size_t{3 * mib + 17}, std::size_t{9200000}}) {
      const storage_key k = random_key(rng, held.size() % 2 ? value_kind::checkpoint : value_kind::kv);
      const value_meta m = meta_for(k, rng);
      held.emplace_back(k, random_bytes(rng, n));
      metas.push_back(m);
      const io_result r = put(b, k, m, held.back().second);
      CHECK(r.status == io_status::ok);
      CHECK(r.bytes == static_cast<std::int64_t>(n));
    }
    for (std::size_t i = 0; i < held.size(); ++i) {
      CAPTURE(held[i].second.size());
      std::vector<std::byte> into(held[i].second.size() + 5, std::byte{0x5a});
      const io_result r = get(b, held[i].first, into);
      REQUIRE(r.status == io_status::ok);
      CHECK(r.bytes == static_cast<std::int64_t>(held[i].second.size()));
      CHECK(r.meta == metas[i]);
      CHECK(std::equal(held[i].second.begin(), held[i].second.end(), into.begin()));
    }
    const backend_counters c = b.counters();
    CHECK(c.puts == 7);
    CHECK(c.hits == 7);
    CHECK(c.misses == 0);
    CHECK(c.corrupt == 0);
    CHECK(b.used_bytes() <= b.capacity_bytes());
  }

  SUBCASE("a key differing in one field is another value; absent keys are counted misses") {
    F f(16 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(12);
    const storage_key k = random_key(rng);
    const auto v = random_bytes(rng, 1000);
    REQUIRE(put(b, k, {0, {}}, v).status == io_status::ok);
    storage_key other_model = k, other_prefix = k, other_tokens = k, other_kind = k;
    other_model.model ^= 1;
    other_prefix.prefix ^= 1;
    other_tokens.tokens += 1;
    other_kind.kind = value_kind::checkpoint;
    std::vector<std::byte> into(2000);
    for (const storage_key& o : {other_model, other_prefix, other_tokens, other_kind})
      CHECK(get(b, o, into).status == io_status::not_found);
    CHECK(b.counters().misses == 4);
    CHECK(exists(b, {k, other_model, other_prefix, other_tokens, other_kind}) ==
          std::vector<std::uint8_t>{1, 0, 0, 0, 0});
    CHECK(get(b, k, into).status == io_status::ok);
  }

  SUBCASE("put replaces, remove removes, exists answers a batch") {
    F f(16 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(13);
    std::vector<storage_key> keys;
    for (int i = 0; i < 40; ++i) keys.push_back(random_key(rng));
    for (std::size_t i = 0; i < keys.size(); i += 2) REQUIRE(put(b, keys[i], {0, {}}, random_bytes(rng, 100 + i)).status == io_status::ok);
    std::vector<std::uint8_t> expect(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) expect[i] = i % 2 == 0 ? 1 : 0;
    CHECK(exists(b, keys) == expect);
    const auto second = random_bytes(rng, 777);
    REQUIRE(put(b, keys[0], {3, {layer_order::token_major, 2}}, second).status == io_status::ok);
    std::vector<std::byte> into(1000);
    const io_result r = get(b, keys[0], into);
    REQUIRE(r.status == io_status::ok);
    CHECK(r.bytes == 777);
    CHECK(r.meta == value_meta{3, {layer_order::token_major, 2}});
    CHECK(std::equal(second.begin(), second.end(), into.begin()));
    CHECK(remove(b, keys[2]).status == io_status::ok);
    CHECK(remove(b, keys[2]).status == io_status::not_found);
    CHECK(remove(b, keys[1]).status == io_status::not_found);
    CHECK(get(b, keys[2], into).status == io_status::not_found);
    expect[2] = 0;
    CHECK(exists(b, keys) == expect);
    CHECK(exists(b, {}).empty());
  }

  SUBCASE("a buffer smaller than the value is too_large and is not written") {
    F f(16 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(14);
    const storage_key k = random_key(rng);
    REQUIRE(put(b, k, {0, {}}, random_bytes(rng, 5000)).status == io_status::ok);
    std::vector<std::byte> small(4999, std::byte{0x33});
    const io_result r = get(b, k, small);
    CHECK(r.status == io_status::too_large);
    CHECK(r.bytes == 5000);
    CHECK(std::all_of(small.begin(), small.end(), [](std::byte x) { return x == std::byte{0x33}; }));
  }

  SUBCASE("a corrupted value is a counted miss and is gone afterwards") {
    F f(16 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(15);
    // Below and above 1 MiB: the disk tier reads the two with different code (pread / mmap).
    for (const std::size_t n : {std::size_t{300000}, std::size_t{2500000}}) {
      CAPTURE(n);
      const backend_counters before = b.counters();
      const storage_key k = random_key(rng, value_kind::checkpoint);
      const auto v = random_bytes(rng, n);
      REQUIRE(put(b, k, {k.tokens, {}}, v).status == io_status::ok);
      REQUIRE(f.corrupt(k));
      std::vector<std::byte> into(v.size());
      CHECK(get(b, k, into).status == io_status::corrupt);
      CHECK(b.counters().corrupt == before.corrupt + 1);
      CHECK(b.counters().hits == before.hits);
      CHECK(exists(b, {k}) == std::vector<std::uint8_t>{0});
      CHECK(get(b, k, into).status == io_status::not_found);
      REQUIRE(put(b, k, {k.tokens, {}}, v).status == io_status::ok);  // and can be stored again
      CHECK(get(b, k, into).status == io_status::ok);
      CHECK(into == v);
    }
  }

  SUBCASE("tickets are consumed once; stale and forged tickets are refused; a full queue is busy") {
    F f(16 * mib, 4);
    auto& b = f.backend();
    std::mt19937_64 rng(16);
    const storage_key k = random_key(rng);
    const auto v = random_bytes(rng, 2000);
    const auto t = b.put(k, {0, {}}, v);
    REQUIRE(t);
    const auto done = b.wait_for(*t, std::chrono::seconds(10));
    REQUIRE(done);
    CHECK(done->status == io_status::ok);
    CHECK(b.wait(*t).error() == errc::stale_handle);
    CHECK(b.poll(*t).error() == errc::stale_handle);
    CHECK(b.wait(io_ticket{}).error() == errc::stale_handle);
    CHECK(b.wait(io_ticket{999, 1}).error() == errc::stale_handle);
    // Four operations outstanding fill a depth-4 queue; a fifth is refused, nothing queued.
    std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(2000));
    std::vector<io_ticket> tickets;
    for (int i = 0; i < 4; ++i) {
      const auto ti = b.get(k, bufs[static_cast<std::size_t>(i)]);
      REQUIRE(ti);
      tickets.push_back(*ti);
    }
    std::vector<std::byte> extra(2000);
    const auto refused = b.get(k, extra);
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == errc::busy);
    CHECK(b.counters().rejected_busy == 1);
    for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
      while (!b.poll(*it).value()) {
      }
      const auto r = b.wait(*it);
      REQUIRE(r);
      CHECK(r->status == io_status::ok);
    }
    for (const auto& buf : bufs) CHECK(buf == v);
    CHECK(b.counters().gets == 4);
  }

  SUBCASE("bad input is invalid_argument and changes nothing") {
    F f(16 * mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(17);
    const storage_key k = random_key(rng);
    const auto v = random_bytes(rng, 100);
    REQUIRE(put(b, k, {0, {}}, v).status == io_status::ok);
    const backend_counters before = b.counters();
    const std::int64_t used = b.used_bytes();
    storage_key negative = k, bad_kind = k, checkpoint = k;
    negative.tokens = -1;
    bad_kind.kind = static_cast<value_kind>(9);
    checkpoint.kind = value_kind::checkpoint;
    std::vector<std::byte> into(100);
    CHECK(b.put(negative, {0, {}}, v).error() == errc::invalid_argument);
    CHECK(b.put(bad_kind, {0, {}}, v).error() == errc::invalid_argument);
    CHECK(b.put(k, {k.tokens + 1, {}}, v).error() == errc::invalid_argument);       // span past its end
    CHECK(b.put(k, {-1, {}}, v).error() == errc::invalid_argument);
    CHECK(b.put(checkpoint, {0, {}}, v).error() == errc::invalid_argument);         // a checkpoint spans no tokens
    CHECK(b.put(k, {0, {static_cast<layer_order>(7), 1}}, v).error() == errc::invalid_argument);
    CHECK(b.get(negative, into).error() == errc::invalid_argument);
    CHECK(b.remove(bad_kind).error() == errc::invalid_argument);
    std::vector<std::uint8_t> found(2);
    const std::vector<storage_key> one{k};
    CHECK(b.exists(one, found).error() == errc::invalid_argument);
    const backend_counters after = b.counters();
    CHECK(after.puts == before.puts);
    CHECK(after.gets == before.gets);
    CHECK(after.exists_calls == before.exists_calls);
    CHECK(after.put_failures == before.put_failures);
    CHECK(b.used_bytes() == used);
    const io_result r = get(b, k, into);
    CHECK(r.status == io_status::ok);
    CHECK(into == v);
  }

  SUBCASE("a value larger than the tier is too_large and stores nothing") {
    F f(mib, 64);
    auto& b = f.backend();
    std::mt19937_64 rng(18);
    const storage_key small = random_key(rng), big = random_key(rng);
    REQUIRE(put(b, small, {0, {}}, random_bytes(rng, 1000)).status == io_status::ok);
    CHECK(put(b, big, {0, {}}, random_bytes(rng, static_cast<std::size_t>(mib))).status == io_status::too_large);
    CHECK(exists(b, {small, big}) == std::vector<std::uint8_t>{1, 0});
    CHECK(b.counters().put_failures == 1);
  }

  SUBCASE("random operations agree with the LRU reference model") {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(seed);
      constexpr std::int64_t capacity = 400000;
      F f(capacity, 64);
      auto& b = f.backend();
      hybridcache::test::memory_storage_backend ref(capacity);
      std::mt19937_64 rng(seed * 7919);
      std::vector<storage_key> keys;
      for (int i = 0; i < 24; ++i) keys.push_back(random_key(rng, i % 3 == 0 ? value_kind::checkpoint : value_kind::kv));
      for (int op = 0; op < 300; ++op) {
        const storage_key& k = keys[rng() % keys.size()];
        const int what = static_cast<int>(rng() % 10);
        if (what < 4) {
          const auto v = random_bytes(rng, 1 + rng() % 60000);
          const value_meta m = meta_for(k, rng);
          const io_result got = put(b, k, m, v), want = put(ref, k, m, v);
          CHECK(got.status == want.status);
        } else if (what < 8) {
          std::vector<std::byte> a(70000), c(70000);
          const io_result got = get(b, k, a), want = get(ref, k, c);
          REQUIRE(got.status == want.status);
          if (want.status == io_status::ok) {
            CHECK(got.bytes == want.bytes);
            CHECK(got.meta == want.meta);
            CHECK(std::equal(a.begin(), a.begin() + got.bytes, c.begin()));
          }
        } else if (what < 9) {
          CHECK(exists(b, keys) == exists(ref, keys));
        } else {
          CHECK(remove(b, k).status == remove(ref, k).status);
        }
        REQUIRE(b.used_bytes() == ref.used_bytes());
      }
      CHECK(b.counters().evictions == ref.counters().evictions);
      CHECK(b.counters().evictions > 0);
      CHECK(b.counters().hits == ref.counters().hits);
      CHECK(b.counters().misses == ref.counters().misses);
    }
  }
}
